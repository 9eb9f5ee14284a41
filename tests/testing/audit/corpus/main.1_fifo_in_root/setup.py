# The directory the user already has holds a FIFO (a named pipe), which git cannot hold.
import os

os.makedirs("ckpts")
os.mkfifo(os.path.join("ckpts", "pipe"))
