"""The data pipeline: conversations -> loss-masked tokens -> (regenerated responses) -> target features.

    draftsmith prepare --target T --input FILE_OR_DATASET... --out DIR [--max-length N]
                       [--last-turn-only] [--eval-fraction F] [--strict] [--draft-vocab-size N]
                       [--regenerate [--temperature X] [--max-new-tokens M] [--batch-size B]]
    draftsmith capture --target T --data DIR --layers eagle3|dflash:N|last|i,j,k --out FEAT
                       [--dtype bf16|fp16|fp32|fp8] [--topk-logits K]
    draftsmith capture --verify FEAT
    accelerate launch --num_processes 2 -m draftsmith.data.commands capture ...   (data parallel)

Modules, in the order data flows through them:
  sources     jsonl / json / parquet / saved `datasets` folders / hub names / builtin:stdlib -> rows
  templates   row checks (OpenAI `messages` or ShareGPT `conversations`) and the assistant-only loss mask
  corpus      builtin:stdlib, the offline training corpus made from Python's standard library;
              builtin:stdlib-complete, its functions as stubs to complete (for regeneration)
  exercises   builtin:exercises, typed exercises with worked examples in a code benchmark's prompt shape
  general     builtin:general, prompts of ten categories beyond code (a quarter multi-turn), for regeneration
  suite       builtin:suite, the held-out eval prompts (`draftsmith eval --prompts builtin:suite`)
  regenerate  assistant turns rewritten by the target on its own earlier turns, batched, resumable after kill -9
  prepared    the `prepare` step: DatasetDict + prepare_report.json + token_counts.safetensors
  vocab       draft vocabulary (d2t offsets, t2d) from trainable-token counts
  capture     layer specs, TokenDataset, collate, capture_batch (online), FeatureShards (offline reader)
  offline     the `capture` step: resumable shards + manifest.json, data parallel, --verify
  commands    the two subcommands
"""
