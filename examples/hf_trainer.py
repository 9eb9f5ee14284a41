"""A Hugging Face ``Trainer`` whose checkpoints are atomic and durable: kill it, run it again.

    python examples/hf_trainer.py OUTPUT_DIR [--steps 40]
    torchrun --nproc_per_node=2 examples/hf_trainer.py OUTPUT_DIR    # DDP (gloo on CPU)

Trains a tiny randomly initialised GPT-2 on CPU (nothing is downloaded), saving
``OUTPUT_DIR/checkpoint-N/`` every 10 steps and keeping the last 2. Kill it at any moment
(Ctrl-C, ``kill -9``) and run the same command again: it resumes from the newest complete
checkpoint. Prints ``resumed from <dir>`` or ``fresh start``, then ``done <step>``.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast, TrainingArguments

from atomic_ckpt.integrations.transformers import AtomicTrainer, last_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()

    vocab = 64
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t1")
    ids = torch.randint(0, vocab, (256, 16), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in ids]
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=vocab))

    training_args = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.steps,
        save_steps=10,
        save_total_limit=2,  # rotation by atomic_ckpt: complete checkpoints only, durably
        per_device_train_batch_size=4,
        use_cpu=True,
        report_to=[],
        logging_steps=10,
    )
    trainer = AtomicTrainer(
        model=model, args=training_args, train_dataset=data, processing_class=tokenizer
    )
    found = last_checkpoint(args.output_dir)  # the newest *complete* checkpoint, or None
    print(f"resumed from {found}" if found else "fresh start", flush=True)
    trainer.train(resume_from_checkpoint=found is not None)
    print(f"done {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
