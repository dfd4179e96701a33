"""The training recipe: one class, read top to bottom (setup -> train -> cleanup).

One loop for every trained drafter kind: it only calls `drafter.loss(batch, target_head)`.
Accelerate supplies the topology (single process, DDP, DeepSpeed ZeRO-2/3, FSDP) from
`accelerate launch --config_file ...`; the recipe supplies everything else (precision,
accumulation, clipping, schedule), so the same recipe gives the same run under any launcher.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

import torch
from torch import nn

from draftsmith.config import to_dict
from draftsmith.errors import DraftsmithError
from draftsmith.files import replace_folder, write_atomically
from draftsmith.target import flush_denormals
from draftsmith.train import checkpoint
from draftsmith.train.builders import DrafterLoss, broadcast, build_accelerator, flatten, to_device, warmup_cosine
from draftsmith.train.config import TrainConfig, drafter_config
from draftsmith.train.data import SampleOrder, TrainingData, build_training_data, micro_batch_index
from draftsmith.train.optimizers import build_optimizer
from draftsmith.train.validate import decode_acceptance_length, implied_acceptance_length, step_accuracies

LOG_FILE = "metrics.jsonl"


class TrainRecipe:
    """`draftsmith train`: setup() -> train() -> cleanup(). Tests may hand in data and a target."""

    def __init__(self, config: TrainConfig, data: TrainingData | None = None, target=None):
        self.config = config
        self.output_dir = Path(config.output_dir)
        self.data = data
        self.target = target
        self.step = 0
        self.best_score: float | None = None
        self.best_step: int | None = None
        self.train_seconds = 0.0  # wall time of the training loop so far, resumed runs' included
        self.budget_share = 0.0  # of train.max_minutes, the largest over processes, as of the last step
        self.decoder_missing = False
        self.wandb_run: dict | None = None

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        """Build everything; continue from `output_dir/latest` when resume=true."""
        flush_denormals()  # the CLI already did, before torch's threads started; a library caller gets this thread
        self._setup_target()  # before DeepSpeed starts: under ZeRO-3 it would partition the frozen target
        self.accelerator = build_accelerator(self.config)
        self.main = self.accelerator.is_main_process
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched != self.accelerator.num_processes:  # processes that would train without syncing
            raise DraftsmithError(
                f"{launched} processes were launched but Accelerate set up {self.accelerator.num_processes} "
                "synchronised one(s). Use one of the configs in recipes/accelerate/."
            )
        sharded = self.config.target.shard != "none"
        if not sharded:
            self.target.model.to(self.accelerator.device)
        self._check_output_dir()
        self._setup_model()  # from the whole target: a drafter may start from its weights
        if sharded:  # its pieces move to the device layer by layer: the whole target never sits on one
            from draftsmith.sharding import shard_target

            shard_target(self.target, self.accelerator.device, self.config.target.shard_group)
        self._setup_data()
        self._setup_optimizer()
        self._setup_tracking()
        if self.config.resume and checkpoint.latest_checkpoint(self.output_dir) is not None:
            self._resume()
        elif self.main:
            (self.output_dir / LOG_FILE).write_text("")
        if self.main:
            state = self.accelerator.state
            if sharded:
                from draftsmith.sharding import weight_bytes

                local, total = weight_bytes(self.target.model)
                print(f"target sharded over {self.config.target.shard_group or state.num_processes} processes: "
                      f"{100 * local / total:.1f}% of its weights on each ({local / 2**20:.1f} of {total / 2**20:.1f} MiB)")
            print(f"training {self.kind} drafter: {state.distributed_type.value} x{state.num_processes} on "
                  f"{state.device.type}, precision {self.config.train.precision} -> {state.mixed_precision}, global batch "
                  f"{self.layout()['global_batch']} sequences -> {self.output_dir}")

    def _check_output_dir(self) -> None:
        existing = checkpoint.latest_checkpoint(self.output_dir)
        if existing is not None and not self.config.resume:
            raise DraftsmithError(
                f"'{self.output_dir}' already holds a training run ({existing.name}). Pass resume=true to "
                "continue it, or choose another output_dir."
            )
        if self.main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            import yaml

            (self.output_dir / "train_config.yaml").write_text(yaml.safe_dump(to_dict(self.config), sort_keys=False))

    def load_target(self):
        """The frozen target (loaded once; the pipeline's prepare step shares it)."""
        if self.target is None:
            from draftsmith.target import load_target

            spec = self.config.target
            self.target = load_target(spec.name, dtype=spec.dtype, trust_remote_code=spec.trust_remote_code)
        return self.target

    def _setup_target(self) -> None:
        self.load_target().model.requires_grad_(False)

    def _setup_model(self) -> None:
        from accelerate.utils import set_seed

        self.kind, self.drafter_options = drafter_config(self.config.drafter)
        self.draft_vocab = None
        if self.config.data.draft_vocab:
            from draftsmith.data.vocab import load_draft_vocab

            self.draft_vocab = load_draft_vocab(self.config.data.draft_vocab, self.target)
        set_seed(self.config.train.seed)  # same initial drafter on every process
        if self.config.init_from:  # a fine-tune: the checkpoint's weights, architecture and draft vocabulary
            from draftsmith.train.init_from import starting_drafter

            drafter, self.drafter_options, self.draft_vocab = starting_drafter(
                self.kind, self.config.drafter, self.config.init_from, self.target, self.draft_vocab,
                self.config.data.draft_vocab)
        else:
            drafter = self._fresh_drafter()
        set_seed(self.config.train.seed, device_specific=True)  # then distinct random draws per process
        self.layers = list(drafter.required_layers)
        self.model = DrafterLoss(drafter, self.target.head)

    def _fresh_drafter(self) -> nn.Module:
        from draftsmith.drafters import kind_module

        return kind_module(self.kind).create(self.drafter_options, self.target, self.draft_vocab)

    def _setup_data(self) -> None:
        if self.data is None:
            self.data = build_training_data(self.config, self.target, self.layers, self.config.eval.num_prompts)
        lengths = None
        if self.config.data.group_by_length and hasattr(self.data.train, "lengths"):
            lengths = [min(n, self.config.data.max_length) for n in self.data.train.lengths()]
        self.order = SampleOrder(len(self.data.train), self.config.data.batch_size, self.config.train.seed, lengths)

    def _setup_optimizer(self) -> None:
        cfg = self.config.train
        trainable = [(n.removeprefix("drafter."), p) for n, p in self.model.named_parameters() if p.requires_grad]
        lr_scale = getattr(self.model.drafter, "lr_scale", lambda name: 1.0)  # a kind may give parts their own rate
        # One fused AdamW kernel over every parameter (bench/train_step_profile.py: 3x faster than torch's per-tensor
        # loop for the EAGLE-3 drafter on 2 CPU cores); FSDP and DeepSpeed bring their own optimizer step.
        from accelerate.utils import DistributedType

        sharded = {DistributedType.DEEPSPEED: "DeepSpeed ZeRO", DistributedType.FSDP: "FSDP1"}.get(
            self.accelerator.distributed_type)
        if sharded == "FSDP1" and getattr(self.accelerator.state.fsdp_plugin, "fsdp_version", 1) == 2:
            sharded = "FSDP2"
        fused = self.accelerator.device.type in ("cpu", "cuda") and sharded is None
        optimizer = build_optimizer(trainable, cfg, lr_scale, fused, sharded_by=sharded)
        # the share of train.max_minutes spent, as every process agrees on it (`_out_of_time`): the same rate everywhere
        budget_spent = (lambda: self.budget_share) if cfg.max_minutes else None
        schedule = warmup_cosine(cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio, budget_spent)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        plugin = self.accelerator.state.deepspeed_plugin
        if plugin is not None:  # DeepSpeed clips and accumulates inside its engine: hand it the recipe's values
            plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = self.config.data.batch_size
            plugin.deepspeed_config["gradient_accumulation_steps"] = cfg.grad_accum
            # DeepSpeed's Muon would be clipped after Newton-Schulz: an orthogonalised update's norm is about
            # sqrt(rows) whatever the gradient, so clipping it to max_grad_norm shrinks every Muon step many times
            muon = cfg.optimizer == "muon"
            plugin.deepspeed_config["gradient_clipping"] = 0.0 if muon else cfg.max_grad_norm
            if muon and plugin.zero_stage == 3:  # ZeRO-3 gathers Muon's matrices itself, not by reduce-scatter
                plugin.deepspeed_config.setdefault("zero_optimization", {})["reduce_scatter"] = False
            if muon and cfg.max_grad_norm > 0 and self.main:
                print(f"train.max_grad_norm={cfg.max_grad_norm:g} is not applied under DeepSpeed with Muon: DeepSpeed "
                      "clips Muon's orthogonalised updates, not the gradients, which would shrink every Muon step.")
            plugin.deepspeed_config["train_batch_size"] = (
                self.config.data.batch_size * cfg.grad_accum * self.accelerator.num_processes
            )
        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(self.model, optimizer, scheduler)

    def _setup_tracking(self) -> None:
        tracking = self.config.tracking
        if not tracking.report_to:
            return
        import importlib.util

        missing = [name for name in tracking.report_to if importlib.util.find_spec(name) is None]
        if missing:  # Accelerate would drop them with a log line and the run would track nothing
            raise DraftsmithError(f"tracking.report_to names {', '.join(missing)}, which is not installed: "
                                  f"pip install {' '.join(missing)} (or remove it from tracking.report_to).")
        run_name = tracking.run_name or self.output_dir.resolve().name
        self.accelerator.init_trackers(
            tracking.project, config=flatten(to_dict(self.config)),
            init_kwargs={"wandb": {"name": run_name, "dir": str(self.output_dir)}},
        )
        if "wandb" in tracking.report_to and self.main:  # the model card links and logs to this run
            run = self.accelerator.get_tracker("wandb", unwrap=True)
            self.wandb_run = {"id": run.id, "project": run.project, "entity": run.entity,
                              "url": run.url, "dir": str(run.dir)}

    def _resume(self) -> None:
        folder = checkpoint.latest_checkpoint(self.output_dir)
        state = checkpoint.load_checkpoint(self.accelerator, folder)
        layout = self.layout()
        if state["layout"]["global_batch"] != layout["global_batch"] or state["layout"]["batch_size"] != layout["batch_size"]:
            raise DraftsmithError(
                f"{folder} was trained with {state['layout']} (processes x grad_accum x batch_size); this run has "
                f"{layout}. Resume with the same batch_size and global batch, or start a new output_dir."
            )
        self.step = state["step"]
        if self.data.topk_memory is not None and self._topk_memory_file(folder).is_file():
            self.data.topk_memory.load(self._topk_memory_file(folder))
        saved, current = state["data"], self._data_position()
        if (saved["num_samples"], saved["seed"]) != (current["num_samples"], current["seed"]):
            raise DraftsmithError(
                f"{folder} was trained on {saved['num_samples']} samples in order seed {saved['seed']}; this run "
                f"has {current['num_samples']} samples and seed {current['seed']}, so it cannot continue where "
                "that one stopped. Use the same data and train.seed, or start a new output_dir."
            )
        self.best_score, self.best_step = state["best_score"], state["best_step"]
        self.train_seconds = state.get("train_seconds", 0.0)  # checkpoints from before the budget have none
        if state.get("select_by", "decoded") != self.config.eval.select_by:  # older checkpoints chose by decode
            print(f"best/ (step {self.best_step}) was chosen by {state.get('select_by', 'decoded')} τ; this run chooses "
                  f"by {self.config.eval.select_by} τ, so the next validation starts the comparison again.")
            self.best_score = None
        if self.main:  # a killed run may have logged steps past its last checkpoint: drop them
            path = self.output_dir / LOG_FILE
            lines = path.read_text().splitlines() if path.is_file() else []
            kept = [line for line in lines if line and json.loads(line)["step"] <= self.step]
            path.write_text("".join(line + "\n" for line in kept))
            print(f"Resuming from {folder} (step {self.step}).")

    def _data_position(self) -> dict:
        """Where the sample stream stands: the order is a function of (seed, samples consumed)."""
        consumed = self.step * self.layout()["global_batch"]
        return {"seed": self.config.train.seed, "num_samples": len(self.data.train), "samples_consumed": consumed,
                "epoch": consumed // len(self.data.train)}

    def layout(self) -> dict:
        world, accum, batch = self.accelerator.num_processes, self.config.train.grad_accum, self.config.data.batch_size
        return {"processes": world, "grad_accum": accum, "batch_size": batch, "global_batch": world * accum * batch}

    # ------------------------------------------------------------------ train
    def train(self) -> None:
        """Optimizer steps until max_steps, with validation and checkpoints on their schedules."""
        from tqdm.auto import tqdm

        cfg = self.config.train
        if self._out_of_time():
            if self.main:
                print(f"train.max_minutes={cfg.max_minutes:g} was spent before step {self.step}: nothing to train "
                      "(raise it to continue).")
            return
        if self.config.init_from and self.step == 0:  # the starting checkpoint's held-out accuracy, before any update
            self.validate()
        bar = tqdm(total=cfg.max_steps, initial=self.step, disable=not self.main, unit="step", dynamic_ncols=True)
        self.model.train()
        mark = time.perf_counter()
        while self.step < cfg.max_steps:
            started = time.perf_counter()
            record = self._train_step()
            self.step += 1
            record["tokens_per_s"] = record["tokens"] / max(time.perf_counter() - started, 1e-9)
            self._log(record)
            if self.step % cfg.log_every == 0:
                bar.set_postfix(loss=f"{record['loss']:.4f}", tok_s=f"{record['tokens_per_s']:.0f}", refresh=False)
            bar.update(1)
            self.train_seconds += time.perf_counter() - mark  # the previous validation and checkpoint included
            mark = time.perf_counter()
            out_of_time = self._out_of_time()
            last = self.step == cfg.max_steps or out_of_time
            if last or (cfg.eval_every and self.step % cfg.eval_every == 0):
                self.validate()
            if last or (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0):
                self.save_checkpoint()
            if out_of_time:
                if self.main:
                    bar.write(f"stopped at step {self.step} of {cfg.max_steps}: train.max_minutes={cfg.max_minutes:g} "
                              f"is spent ({self.train_seconds / 60:.1f} min)")
                break
        bar.close()

    def _out_of_time(self) -> bool:
        """Whether train.max_minutes is spent; every process stops at the same step once any one has spent it, and
        takes the same share spent (`budget_share`, which the learning-rate schedule follows)."""
        budget = self.config.train.max_minutes
        if not budget:
            return False
        seconds = torch.tensor([self.train_seconds], device=self.accelerator.device)  # float32: every backend has it
        self.budget_share = float(self.accelerator.reduce(seconds, "max").item()) / (budget * 60)
        return self.budget_share >= 1.0

    def _train_step(self) -> dict:
        """One optimizer step: grad_accum micro-batches on every process, then clip, step, schedule."""
        accelerator, accum = self.accelerator, self.config.train.grad_accum
        sums: dict[str, float] = {}
        tokens, grad_norm = 0.0, None
        lr = self.scheduler.get_last_lr()[0]  # the rate this step uses
        with self.target.gathered():  # a sharded target's embedding and head: gathered once for the whole step
            for accum_index in range(accum):
                indices = self._micro_batch_indices(accum_index, accelerator.process_index)
                batch = self._batch(self.data.train, indices)
                batch["micro_batch"] = self._micro_batch_index(accum_index, accelerator.process_index)  # fresh draws
                tokens += float(batch["attention_mask"].sum())
                with accelerator.accumulate(self.model):
                    loss, metrics = self.model(batch)
                    self._check_finite(loss, accum_index)
                    accelerator.backward(loss)
                    if accelerator.sync_gradients and self.config.train.max_grad_norm > 0:
                        grad_norm = accelerator.clip_grad_norm_(self.model.parameters(),
                                                                self.config.train.max_grad_norm)
                    self.optimizer.step()
                    if accelerator.sync_gradients:
                        self.scheduler.step()
                    self.optimizer.zero_grad()
                for key, value in {"loss": loss.detach(), **metrics}.items():
                    sums[key] = sums.get(key, 0.0) + float(value)
        keys = sorted(sums)
        means = accelerator.reduce(torch.tensor([sums[k] / accum for k in keys], device=accelerator.device), "mean")
        record = {"step": self.step + 1, **{k: float(v) for k, v in zip(keys, means)}}
        record["lr"] = lr
        record["tokens"] = float(accelerator.reduce(torch.tensor(tokens, device=accelerator.device), "sum"))
        if grad_norm is not None:
            record["grad_norm"] = float(grad_norm)
        return record

    def _micro_batch_index(self, accum_index: int, rank: int) -> int:
        """This micro-batch's place in the stream of training micro-batches (a function of the step: resumable)."""
        world, accum = self.accelerator.num_processes, self.config.train.grad_accum
        return micro_batch_index(self.step, accum_index, rank, world, accum)

    def _micro_batch_indices(self, accum_index: int, rank: int) -> list[int]:
        return self.order.micro_batch(self._micro_batch_index(accum_index, rank))

    def _batch(self, dataset, indices: list[int]) -> dict:
        from draftsmith.train.data import truncate

        items = [truncate(dataset[i], self.config.data.max_length) for i in indices]
        batch = to_device(self.data.collate(items), self.accelerator.device)
        return self.data.add_features(batch)

    def _check_finite(self, loss: torch.Tensor, accum_index: int) -> None:
        """Stop every process together when any of them sees a NaN/inf loss; name the batch."""
        bad = torch.tensor([0.0 if torch.isfinite(loss.detach()).all() else 1.0], device=self.accelerator.device)
        flags = self.accelerator.gather(bad)
        if not flags.any():
            return
        ranks = [r for r, flag in enumerate(flags.tolist()) if flag]
        samples = {r: self._micro_batch_indices(accum_index, r) for r in ranks}
        kept = checkpoint.latest_checkpoint(self.output_dir)
        raise DraftsmithError(
            f"The loss is not finite (nan/inf) at step {self.step + 1}, micro-batch {accum_index + 1} of "
            f"{self.config.train.grad_accum}, on process(es) {ranks}; training samples (dataset indices) "
            f"{samples}. Stopped without saving; the last good checkpoint is "
            f"{kept if kept else 'none (no checkpoint was written yet)'}. Check those samples, lower "
            "train.lr, or use train.precision=fp32, then continue with resume=true."
        )

    def _log(self, record: dict) -> None:
        if self.main:
            with open(self.output_dir / LOG_FILE, "a") as handle:
                handle.write(json.dumps({"split": "train", **record}) + "\n")
        if self.config.tracking.report_to and record["step"] % self.config.train.log_every == 0:
            values = {f"train/{k}": v for k, v in record.items() if k not in ("step", "split")}
            self.accelerator.log(values, step=record["step"])

    # ------------------------------------------------------------------ validation
    @torch.no_grad()
    def validate(self) -> dict:
        """Held-out per-step accuracy, implied τ, real decode τ; refresh best/ when the selected τ improves
        (`eval.select_by`)."""
        with checkpoint.preserved_rng():  # validation must not change the training trajectory
            self.model.eval()
            with self.target.gathered():
                record = {"step": self.step, **self._held_out_metrics(self.data.eval)}
                for name, held_out in self.data.also.items():  # eval.also: the same figures on more held-out sets
                    record.update({f"{name}/{k}": v for k, v in self._held_out_metrics(held_out).items()})
            self.model.train()
            drafter = self.accelerator.unwrap_model(self.model).drafter
            if hasattr(drafter, "use_held_out"):  # a kind that shapes its drafts from held-out figures (Medusa's tree)
                drafter.use_held_out(record)
            candidate = self.output_dir / f".candidate-{self.step}"
            self._export_drafter(candidate)
            if self.main:
                record.update(self._decode(candidate))
            record = broadcast(record)
            self._keep_if_best(candidate, record)
        self._log_validation(record)
        return record

    def _held_out_metrics(self, held_out) -> dict:
        """Token-weighted means of the drafter's metrics over the first eval.batches batches of `held_out`, and the
        chain τ its per-step accuracies imply."""
        metrics = self._held_out_means(held_out)
        accuracies = step_accuracies(metrics)
        if accuracies:
            metrics["implied_acceptance_length"] = implied_acceptance_length(accuracies)
        return metrics

    def _held_out_means(self, held_out) -> dict:
        """Token-weighted means of the drafter's metrics over the first eval.batches batches of `held_out`."""
        batch_size = self.config.data.batch_size
        count = min(self.config.eval.batches, math.ceil(len(held_out) / batch_size))
        if count == 0:
            return {}
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        per_process = math.ceil(count / world)  # equal call counts: ZeRO-3 gathers weights collectively
        sums, weight_total = {}, 0.0
        for i in range(per_process):
            b = rank + i * world
            real = b < count
            b = b if real else 0
            batch = self._batch(held_out, list(range(b * batch_size, min((b + 1) * batch_size, len(held_out)))))
            loss, metrics = self.model(batch)
            weight = float(batch["loss_mask"].sum()) if real else 0.0
            for key, value in {"loss": loss, **metrics}.items():
                sums[key] = sums.get(key, 0.0) + weight * float(value)
            weight_total += weight
        keys = sorted(sums)
        totals = self.accelerator.reduce(
            torch.tensor([sums[k] for k in keys] + [weight_total], device=self.accelerator.device), "sum"
        ).tolist()
        return {k: v / max(totals[-1], 1e-9) for k, v in zip(keys, totals)}

    def _decode(self, folder: Path) -> dict:
        """τ from the built-in decoder on held-out prompts (main process only)."""
        if self.decoder_missing or not self.config.eval.num_prompts or self.target.sharded:
            return {}  # a sharded target runs only as a group; the decoder is one process (draftsmith.sharding)
        evaluation = self.config.eval
        try:
            result = decode_acceptance_length(self.kind, folder, self.target, self.data.prompts[: evaluation.num_prompts],
                                              evaluation.draft_length, evaluation.max_new_tokens)
        except ImportError as err:
            self.decoder_missing = True
            print(f"Validation decode skipped (the decoder is unavailable: {err}); only the implied τ is logged.")
            return {}
        return result or {}

    def _selection_score(self, record: dict) -> float | None:
        """The τ that picks best/ (`eval.select_by`), else the other one where that one is missing."""
        implied, decoded = record.get("implied_acceptance_length"), record.get("acceptance_length")
        first, second = (implied, decoded) if self.config.eval.select_by == "implied" else (decoded, implied)
        return first if first is not None else second

    def _keep_if_best(self, candidate: Path, record: dict) -> None:
        score = self._selection_score(record)
        record["selected_by"] = self.config.eval.select_by
        improved = self.best_score is None or (score is not None and score > self.best_score)
        if improved:
            self.best_score, self.best_step = score, self.step
        record["best_acceptance_length"], record["best_step"] = self.best_score, self.best_step
        if self.main:
            if improved:
                replace_folder(candidate, self.output_dir / "best")
                write_atomically(self.output_dir / "best.json", json.dumps(record, indent=2))
            else:
                shutil.rmtree(candidate, ignore_errors=True)
        self.accelerator.wait_for_everyone()

    def _log_validation(self, record: dict) -> None:
        if self.main:
            with open(self.output_dir / LOG_FILE, "a") as handle:
                handle.write(json.dumps({"split": "eval", **record}) + "\n")
            shown = {k: round(v, 4) for k, v in record.items() if isinstance(v, float)}
            print(f"validation at step {self.step}: {shown}")
        if self.config.tracking.report_to:
            values = {f"eval/{k}": v for k, v in record.items() if isinstance(v, (int, float)) and v is not None}
            for i, alpha in enumerate(record.get("acceptance_per_position", [])):
                values[f"eval/alpha_{i}"] = alpha
            self.accelerator.log(values, step=self.step)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """checkpoint-<step>/ with everything needed to continue exactly; `latest` points to it."""
        state = {"step": self.step, "best_score": self.best_score, "best_step": self.best_step,
                 "train_seconds": self.train_seconds, "select_by": self.config.eval.select_by,
                 "layout": self.layout(), "kind": self.kind, "data": self._data_position()}
        with checkpoint.preserved_rng():
            return checkpoint.save_checkpoint(self.accelerator, self.output_dir, self.step, state,
                                              self._export_drafter, self.config.train.keep_checkpoints,
                                              self._save_topk_memory if self.data.topk_memory is not None else None)

    def _topk_memory_file(self, folder: Path) -> Path:
        return folder / f"topk_memory_{self.accelerator.process_index}.safetensors"

    def _save_topk_memory(self, folder: Path) -> None:
        self.data.topk_memory.save(self._topk_memory_file(folder))

    def _export_drafter(self, folder: Path) -> None:
        """Collective: write a drafter folder (save_pretrained) from full, unsharded weights."""
        from accelerate.utils import DistributedType

        accelerator = self.accelerator
        plugin = accelerator.state.deepspeed_plugin
        sharded = accelerator.distributed_type == DistributedType.FSDP or (
            accelerator.distributed_type == DistributedType.DEEPSPEED and plugin.zero_stage == 3
        )
        if sharded:  # ZeRO-3 / FSDP keep pieces of each weight on every process: gather them first
            state = accelerator.get_state_dict(self.model)
            if self.main:
                drafter = self._fresh_drafter()
                drafter.load_state_dict({k.removeprefix("drafter."): v for k, v in state.items()})
                drafter.save_pretrained(folder)
        elif self.main:
            accelerator.unwrap_model(self.model).drafter.save_pretrained(folder)
        accelerator.wait_for_everyone()

    # ------------------------------------------------------------------ cleanup
    def cleanup(self) -> None:
        """Close trackers and the process group."""
        self.accelerator.end_training()
