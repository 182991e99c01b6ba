"""Fine-tune a judge: a LoRA adapter that makes a causal LM answer the dapo-genrm prompt with 1 / 0.

The command is ``genrm-judge-train`` (packages/judge-train, ``genrm_judge_train.cli``); this
script runs it with the same flags, so that the commands written as ``python
scripts/train_judge.py ...`` (REPORT.md, the shipped adapter's ``training.json``) keep working.

    python scripts/train_judge.py --examples my_pairs.jsonl --model /path/to/model --out my-judge
"""

from __future__ import annotations

from genrm_judge_train.cli import main

if __name__ == "__main__":
    main()
