"""`draftsmith train`: one Accelerate loop for every trained drafter kind.

- `config.py`: the recipe sections (target, data, drafter, train, eval, tracking) with documented fields;
- `recipe.py`: `TrainRecipe` (setup -> train -> cleanup): loop, validation, best/, checkpoints, resume;
- `builders.py`: accelerator, loss wrapper, warmup+cosine schedule, small helpers;
- `data.py`: deterministic sample order (the data position is the step), offline shards / online capture;
- `checkpoint.py`: atomic checkpoint folders, the `latest` pointer, RNG isolation;
- `validate.py`: per-step accuracy, the acceptance length it implies, the real decode;
- `command.py`: the CLI subcommand. Launch configs live in recipes/accelerate/.
"""
