# ckpts/ckpt.bin rewritten in place: cut to 0 bytes by the i386 ftruncate64 (int $0x80 from
# a 64-bit C program, as a 32-bit program's glibc makes it), then written and fsynced; a
# kill right after the cut leaves it empty (the audit called it clean: the i386 name was
# not traced). Needs gcc on x86-64; elsewhere the same rewrite with os.ftruncate.
import os
import platform
import shutil
import subprocess

SOURCE = r"""
#include <fcntl.h>
#include <string.h>
#include <unistd.h>
int main(void) {
    char buf[4096];
    long ret;
    int fd = open("ckpts/ckpt.bin", O_RDWR);
    __asm__ volatile("int $0x80" : "=a"(ret) : "a"(194), "b"(fd), "c"(0), "d"(0) : "memory");
    if (fd < 0 || ret != 0) return 3;
    memset(buf, 2, sizeof buf);
    if (write(fd, buf, sizeof buf) != (long)sizeof buf) return 4;
    return fsync(fd) || close(fd);
}
"""
if platform.machine() == "x86_64" and shutil.which("gcc"):
    with open("t.c", "w") as f:
        f.write(SOURCE)
    subprocess.run(["gcc", "-O1", "-o", "t", "t.c"], check=True)
    subprocess.run(["./t"], check=True)
else:
    fd = os.open("ckpts/ckpt.bin", os.O_RDWR)
    os.ftruncate(fd, 0)
    os.write(fd, b"\2" * 4096)
    os.fsync(fd)
    os.close(fd)
