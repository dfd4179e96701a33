"""docs/results.md is what bench/render_results.py renders from the committed records; every table function puts a
record's own figures into its table; a goal's verdict is over runs; a record credits the tree its run started from
and names its drafter by content (bench/records.py)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


render_results = _load("render_results")  # puts bench/ on the path: the modules it is split into, and records.py
import records  # noqa: E402
import results_format  # noqa: E402
import results_page  # noqa: E402
import results_verdicts  # noqa: E402

MACHINE = {"cpu": "Test CPU", "amx": False, "avx512": True, "avx2": True, "cores": 2, "torch_threads": 2,
           "memory_gib": 7.8, "gpu": None}


def entry(bench: str, result: dict, date: str = "2026-12-03T10:00:00Z", commit: str = "a" * 40) -> dict:
    return {"schema": 1, "bench": bench, "command": f"python bench/{bench}.py", "commit": commit, "dirty": False,
            "date": date, "machine": MACHINE, "versions": {"python": "3.11", "torch": "2.13", "transformers": "5"},
            "result": result}


def write(folder: Path, record: dict) -> None:
    path = folder / record["bench"] / f"{record['date'].replace(':', '')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


# ----------------------------------------------------------------------------- the page
def test_committed_page_is_what_the_committed_records_render():
    assert (ROOT / "docs" / "results.md").read_text() == render_results.render(ROOT / "results")


def test_no_records_gives_a_line_per_canonical_bench(tmp_path):
    page = render_results.render(tmp_path)
    for bench in render_results.CANONICAL:
        assert f'<a id="{bench}"></a>' in page
    assert page.count("No record yet") == len(render_results.CANONICAL)


def storage(bytes_per_token: int) -> dict:
    """A feature_storage result whose one row shows `bytes_per_token`."""
    return {"hidden_size": 64, "num_layers": 2, "conversations": 10, "tokens_per_conversation": 100,
            "options": [{"features": "last layer", "bytes_per_token": bytes_per_token, "capture_bytes": 1000}]}


def test_the_latest_record_wins_and_names_its_provenance(tmp_path):
    old = entry("feature_storage", storage(1111), date="2026-12-01T00:00:00Z", commit="b" * 40)
    new = entry("feature_storage", storage(2222), date="2026-12-02T00:00:00Z", commit="c" * 40)
    write(tmp_path, new)
    write(tmp_path, old)
    page = render_results.render(tmp_path)
    assert "| 2,222 |" in page and "| 1,111 |" not in page
    # a schema-1 record's commit was read when it was written: the page says so
    assert "commit cccccccc (read at the end of the run), 2026-12-02T00:00:00Z" in page
    assert "`python bench/feature_storage.py`" in page
    assert "Test CPU (avx512, avx2), 2 cores, 2 torch threads" in page
    assert page.count("No record yet") == len(render_results.CANONICAL) - 1


def test_every_lever_record_is_rendered_newest_first(tmp_path):
    def levers(arm: str, date: str) -> dict:
        result = {"minutes": 4.0, "num_prompts": 40, "max_new_tokens": 96, "seeds": [0],
                  "arms": {arm: {"recipe": "eagle3", "overrides": [f"drafter.loss={arm}"], "baseline": None,
                                 "per_seed": [{"steps": 9, "implied_tau": 1.5, "tau": 1.6, "speedup": 1.2}],
                                 "identical": 40}}}
        return entry("levers", result, date=date, commit=date[8:10] * 20)

    write(tmp_path, levers("tv", "2026-12-02T00:00:00Z"))
    write(tmp_path, levers("jsd", "2026-12-04T00:00:00Z"))
    write(tmp_path, entry("feature_storage", storage(1111), date="2026-12-01T00:00:00Z"))
    write(tmp_path, entry("feature_storage", storage(2222), date="2026-12-02T00:00:00Z"))
    page = render_results.render(tmp_path)
    section = page.split('<a id="levers"></a>')[1].split("<a id=")[0]
    assert section.index("commit 04040404") < section.index("`drafter.loss=jsd`") < section.index(
        "commit 02020202") < section.index("`drafter.loss=tv`")
    assert "| 2,222 |" in page and "| 1,111 |" not in page  # other benches still show only their latest record


def test_a_rerun_of_some_families_replaces_no_record_of_more_families(tmp_path):
    """A families record that reran some families (one trainer fixed, `--families`) sits beside the last record of
    every family, on the page and not in the README's table, which shows the newest run of the whole bench and says
    its budget, CPU and commit; a later run of the whole bench replaces both, whatever its budget."""
    def families(names: list[str], date: str, tau: float, subset: bool = False, minutes: float = 4.0) -> dict:
        result = {"prompts": 20, "max_new_tokens": 128, "minutes_per_family": minutes,
                  "families": {name: {"recipe": name, "overrides": [], "draft_length": 2, "train_minutes": minutes}
                               for name in names},
                  "methods": {f"{name} chain (2)": {"acceptance_length": tau, "speedup_vs_plain": 1.0,
                                                    "identical_to_plain": 20} for name in names}}
        record = entry("families", result, date=date, commit=date[8:10] * 20)
        record["command"] += f" --minutes {minutes:g}" + (" --families " + " ".join(names) if subset else "")
        return record

    write(tmp_path, families(["eagle3", "mtp", "dflash"], "2026-12-03T00:00:00Z", 1.31))
    write(tmp_path, families(["eagle3", "dflash"], "2026-12-06T00:00:00Z", 1.62, subset=True))
    page = render_results.render(tmp_path)
    section = page.split('<a id="families"></a>')[1].split("<a id=")[0]
    assert section.index("commit 06060606") < section.index("commit 03030303")  # both, newest first
    readme = render_results.render_readme(f"a\n{render_results.README_START}\n{render_results.README_END}\nb",
                                          tmp_path)
    assert "| mtp | chain of 2 | 4.0 | 1.31 |" in readme and "commit 03030303" in readme and "1.62" not in readme
    assert "a budget of 4.0 min of CPU training per family, on 2 cores of Test CPU" in readme
    assert "with later reruns of some families" in readme

    # the newest whole run wins even with fewer families than an older one (the bench's default list shrank)
    write(tmp_path, families(["eagle3", "mtp", "dflash", "medusa1"], "2026-12-01T00:00:00Z", 1.01))
    readme = render_results.render_readme(f"a\n{render_results.README_START}\n{render_results.README_END}\nb",
                                          tmp_path)
    assert "commit 03030303" in readme and "medusa1" not in readme

    write(tmp_path, families(["eagle3", "mtp", "dflash", "medusa1"], "2026-12-07T00:00:00Z", 1.44, minutes=20.0))
    section = render_results.render(tmp_path).split('<a id="families"></a>')[1].split("<a id=")[0]
    assert "commit 07070707" in section and "commit 06060606" not in section and "commit 03030303" not in section
    readme = render_results.render_readme(f"a\n{render_results.README_START}\n{render_results.README_END}\nb",
                                          tmp_path)
    assert "| medusa1 | chain of 2 | 20.0 | 1.44 |" in readme and "1.31" not in readme
    assert "a budget of 20.0 min" in readme and "commit 07070707" in readme and "later reruns" not in readme


def test_committed_readme_table_is_what_the_committed_records_render():
    readme = (ROOT / "README.md").read_text()
    assert readme == render_results.render_readme(readme, ROOT / "results")


def test_check_mode_fails_on_a_page_or_a_readme_that_differs(tmp_path, monkeypatch):
    page, readme = tmp_path / "results.md", tmp_path / "README.md"
    page.write_text(render_results.render(tmp_path))
    readme.write_text(render_results.render_readme(
        f"# x\n{render_results.README_START}\nold\n{render_results.README_END}\nrest\n", tmp_path))
    monkeypatch.setattr(sys, "argv", ["render_results.py", "--results", str(tmp_path), "--page", str(page),
                                      "--readme", str(readme), "--check"])
    assert render_results.main() == 0
    kept = page.read_text()
    page.write_text(kept + "edited by hand\n")
    assert render_results.main() == 1
    page.write_text(kept)
    readme.write_text(readme.read_text() + "the README's own text, outside the table\n")
    assert render_results.main() == 0
    readme.write_text(readme.read_text().replace("No record of the whole families bench yet", "A figure by hand"))
    assert render_results.main() == 1


def test_the_readme_table_gives_each_decoded_familys_chain_and_prompt_lookup(tmp_path):
    write(tmp_path, entry("families", {
        "prompts": 10, "max_new_tokens": 96, "minutes_per_family": 3.0,
        "families": {"eagle3": {"draft_length": 2, "train_minutes": 3.1},
                     "dflash": {"draft_length": 7, "train_minutes": 2.9},
                     "eagle3-ttt4": {"draft_length": 2, "train_minutes": 3.0, "variant": True}},
        "methods": {"plain": {"speedup_vs_plain": 1.0, "identical_to_plain": 10},
                    "eagle3 chain (2)": {"acceptance_length": 1.61, "speedup_vs_plain": 1.23, "identical_to_plain": 10},
                    "eagle3 tree (5,8,32)": {"acceptance_length": 1.9, "speedup_vs_plain": 0.8},
                    "dflash chain (7)": {"acceptance_length": 1.2, "speedup_vs_plain": 0.71, "identical_to_plain": 10},
                    "prompt lookup": {"acceptance_length": 1.4, "speedup_vs_plain": 1.3, "identical_to_plain": 10}}}))
    block = render_results.render_readme(f"a\n{render_results.README_START}\n{render_results.README_END}\nb",
                                         tmp_path)
    assert "| eagle3 | chain of 2 | 3.1 | 1.61 | 1.23× | 10/10 |" in block
    assert "| dflash | chain of 7 | 2.9 | 1.20 | 0.71× | 10/10 |" in block
    assert "| prompt lookup | chain, adaptive | – | 1.40 | 1.30× | 10/10 |" in block
    assert "eagle3-ttt4" not in block and "1.90" not in block  # variants are not decoded; trees are on the page
    assert "10 HumanEval prompts, 96 new tokens" in block and "commit aaaaaaaa, 2026-12-03" in block
    assert block.startswith("a\n") and block.endswith("\nb")


def test_staleness_of_an_unknown_commit_says_it_cannot_tell():
    assert "cannot tell" in render_results.staleness(entry("decode", {}, commit="0" * 40))


# ----------------------------------------------------------------------------- one table function per bench
def rendered(bench: str, result: dict) -> str:
    return "\n".join(render_results.CANONICAL[bench][1](result))


def test_families_table():
    text = rendered("families", {
        "prompts": 40, "max_new_tokens": 128, "minutes_per_family": 20.0, "peak_rss_gib": 9.4,
        "families": {"eagle3": {"recipe": "eagle3", "overrides": [], "steps": 812, "train_minutes": 19.7,
                                "training_tokens_per_s": 1234.5, "training_over_forward": 0.61,
                                "held_out_accuracy": [0.281, 0.2], "implied_acceptance_length": 1.34,
                                "trainable_parameters": 4_500_000}},
        "methods": {"plain": {"tokens_per_s": 28.66, "speedup_vs_plain": 1.0, "speedup_vs_generate": 1.02,
                              "identical_to_plain": 40},
                    "eagle3 chain (2)": {"tokens_per_s": 31.5, "acceptance_length": 1.27, "speedup_vs_plain": 1.1,
                                         "speedup_vs_generate": 1.12, "draft_time_fraction": 0.26,
                                         "draft_ms_per_cycle": 5.04, "identical_to_plain": 40}}})
    for figure in ("812", "19.7", "1234", "0.61×", "0.281 / 0.200", "1.34", "4.50", "28.66", "31.50", "1.27",
                   "1.10×", "1.12×", "26%", "5.0", "40/40"):
        assert figure in text, figure


def test_eagle3_table():
    text = rendered("eagle3_smollm2", {
        "training_minutes_budget": 50.0, "online": False, "capture_minutes": 3.2, "steps": 2862,
        "training_tokens_per_s": 2100.4, "training_over_forward": 2.46, "target_forward_tokens_per_s": 853.0,
        "prompts": 40, "max_new_tokens": 128, "peak_rss_gib": 5.5,
        "drafters": {"2048": {"steps_trained": 2862, "train_minutes": 46.8,
                              "held_out": {"step": 2800, "acc_0": 0.687, "acc_1": 0.61, "implied_acceptance_length": 2.09}}},
        "methods": {"eagle3 v2048 chain 2": {"tokens_per_s": 36.1, "speedup_vs_plain": 1.51,
                                             "speedup_vs_generate_prompt_lookup": 1.3, "identical_to_plain": 40,
                                             "acceptance_length": 1.93, "draft_time_fraction": 0.1}}})
    for figure in ("50.0 min", "2862", "2100", "2.46×", "46.8", "2800", "0.687 / 0.610", "2.090", "36.10", "1.51×",
                   "1.30×", "1.93", "10%", "40/40"):
        assert figure in text, figure


def test_serving_table():
    summary = {"e2e_ms": {"mean": 2500.0, "p99": 7100.0}}
    text = rendered("serving", {
        "validation": {"concurrency_1": {"pld": {"fixed": {"error_total": 0.031, "error_max_prompt": -0.08,
                                                           "passed": True},
                                                 "off": {"error_total": 0.012, "error_max_prompt": 0.05,
                                                         "passed": True}}},
                       "batched_forwards": {"passed": True, "error_median": 0.042, "error_max": 0.09}},
        "break_even": {"pld": {"rates": [0.05, 0.1], "e2e_ratio_speculative_over_plain": [0.91, 1.04],
                               "stops_paying_at_rate": 0.0846, "pays_at_every_rate": False}},
        "runs": [{"traces": "pld", "policy": "fcfs", "speculation": "fixed", "rate": 0.05, "summary": summary}]})
    for figure in ("3.1%", "-8.0%", "1.2%", "4.2%", "0.91, 1.04", "0.085", "2.50 / 7.10", "rate 0.05"):
        assert figure in text, figure


def test_feature_storage_table():
    text = rendered("feature_storage", {"hidden_size": 8192, "num_layers": 80, "conversations": 100000,
                                        "tokens_per_conversation": 1000, "tokens": 100000000,
                                        "options": [{"features": "EAGLE-3 layers + last, bf16", "layers": 4,
                                                     "dtype": "bf16", "topk_logits": 0, "bytes_per_token": 65541,
                                                     "capture_bytes": 6554101600000}]})
    for figure in ("8192", "100,000", "65,541", "6.6 TB"):
        assert figure in text, figure


def test_general_mix_table():
    arm = lambda speed: {"rows": 300, "tokens": 61234, "steps": 900, "implied_acceptance_length": 1.61,  # noqa: E731
                         "suite": {"acceptance_length": 1.4, "speedup": speed,
                                   "per_category": {"code": {"prompts": 2, "acceptance_length": 1.71, "speedup": 1.33},
                                                    "math": {"prompts": 2, "acceptance_length": 1.2,
                                                             "speedup": speed + 0.01}}},
                         "humaneval": {"acceptance_length": 1.8, "speedup": 1.4}}
    text = rendered("general_mix", {"num_prompts": 20, "humaneval_prompts": 10, "max_new_tokens": 96, "draft_length": 2,
                                    "arms": {"code": arm(1.05), "mix": arm(1.125)},
                                    "checks": {"humaneval_kept_90_percent": True,
                                               "mix_wins_every_non_code_category": False}})
    assert "| math | 2 | 1.20 | 1.06× | 1.20 | 1.14× |" in text
    assert "| **HumanEval** | 10 | 1.80 | 1.40× | 1.80 | 1.40× |" in text
    assert "| mix | 300 | 61,234 | 900 | 1.61 |" in text
    # one run's ratios, no verdict (that is over runs)
    assert "This run: the mix's HumanEval speedup 1.000× the code arm's; in its worst category but code, 1.071×" in text



def test_memory_plan_table():
    text = rendered("memory_plan", {"processes": 8, "dtype": "bfloat16", "batch_size": 4, "max_length": 2048,
                                    "state_bytes_per_parameter": 16, "targets": [
                                        {"architecture": "llama-3.1-8b", "target_parameters": 8030261248,
                                         "draft_vocab": 32000, "drafter_trainable": 424689664,
                                         "drafter_parameters": {"fc": 50331648, "head": 131072000},
                                         "drafter_trainable_full_vocab": 819073024,
                                         "rows": [{"launcher": "ZeRO-2", "target": "whole", "target_bytes": 16060522496,
                                                   "drafter_state_bytes": 2335793152, "features_bytes": 268435456,
                                                   "total_bytes": 18664751104}]}]})
    assert "| llama-3.1-8b | 8.03 B | 424.7 M | fc 50.3 M, head 131.1 M | 32,000 | 819.1 M |" in text
    assert "| llama-3.1-8b | ZeRO-2 | whole | 16.06 | 2.34 | 0.27 | **18.66** |" in text


def test_memory_plan_counts_the_drafter_draftsmith_trains():
    """The bench's parameter count of the EAGLE-3 drafter for Llama-3.1-8B, against the hand count from its shape."""
    memory_plan = _load("memory_plan")
    H, I, kv, N = 4096, 14336, 8 * 128, 32000
    hand = {"fc": 3 * H * H, "attention": 2 * H * H + 2 * (2 * H) * kv + H * H, "mlp": 3 * H * I,
            "head": H * N, "norms": 4 * H}
    config = memory_plan.target_config("llama-3.1-8b")
    assert memory_plan.drafter_parts(config, N) == hand
    plan = memory_plan.plan("llama-3.1-8b", processes=8, draft_vocab=N, dtype="bfloat16", batch_size=4, max_length=2048)
    assert plan["target_parameters"] == 8_030_261_248  # Llama-3.1-8B's published size
    rows = {(r["launcher"], r["target"]): r for r in plan["rows"]}
    trainable = sum(hand.values())
    assert rows["DDP", "whole"]["drafter_state_bytes"] == 16 * trainable
    assert rows["ZeRO-2", "whole"]["drafter_state_bytes"] == 4 * trainable + 12 * trainable / 8
    # sharded: an eighth of the weights, plus embedding, head, final norm and one decoder layer whole while they run
    layer = (2 * H * H + 2 * H * kv) + 3 * H * I + 2 * H
    gathered = 2 * (2 * 128256 * H + H + layer)
    assert rows["ZeRO-3 / FSDP", "target.shard=fsdp"]["target_bytes"] == 2 * 8_030_261_248 / 8 + gathered

def test_a_record_made_with_a_limited_instruction_set_says_so():
    limited = {**entry("decode", {}), "machine": {"cpu": "Xeon", "amx": True, "avx512": True, "avx2": True, "cores": 2,
                                                  "isa_limit": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}}
    assert "(amx, avx512, avx2; limited to ONEDNN_MAX_CPU_ISA=AVX2)" in "\n".join(results_page.provenance(limited))


def test_levers_table():
    def arm(baseline, overrides, steps, implied, tau, verdict=None):
        per_seed = [{"steps": s, "implied_tau": i, "tau": t, "speedup": t * 0.8}
                    for s, i, t in zip(steps, implied, tau)]
        entry = {"recipe": "eagle3", "overrides": overrides, "baseline": baseline, "per_seed": per_seed,
                 "identical": 80}
        return entry | ({"verdict": verdict, "tau_vs_baseline": sum(tau) / 2 / 1.6} if verdict else {})

    text = rendered("levers", {"minutes": 4.0, "num_prompts": 40, "max_new_tokens": 96, "seeds": [0, 1],
                               "arms": {"eagle3": arm(None, [], [900, 910], [1.5, 1.52], [1.6, 1.6]),
                                        "muon": arm("eagle3", ["train.optimizer=muon"], [850, 860], [1.55, 1.6],
                                                    [1.7, 1.66], "won")}})
    assert "| eagle3 | `eagle3 as shipped` | – | 900 / 910 | 1.50 / 1.52 | 1.60 / 1.60 | 1.28× / 1.28× | – | 80/80 | – |" in text
    assert ("| muon | `train.optimizer=muon` | eagle3 | 850 / 860 | 1.55 / 1.60 | 1.70 / 1.66 | 1.36× / 1.33× | "
            "1.050× | 80/80 | **won** |") in text
    assert "on the default recipe's data" in text
    dflash = rendered("levers_dflash", {"minutes": 4.0, "num_prompts": 20, "max_new_tokens": 96, "seeds": [0, 1],
                                        "data_recipe": "dflash", "arms": {}})
    assert "on the `dflash` recipe's data" in dflash


def test_dflash_peer_table():
    figures = {"held_out_accuracy": [0.3, 0.2, 0.1, 0.05], "implied_tau": 1.37, "tau": 1.4, "speedup": 1.1,
               "identical": 20}
    text = rendered("dflash_peer", {
        "steps": 150, "seeds": [0, 1], "peer_lr": 1e-3, "peer_anchors": 512, "num_prompts": 20, "max_new_tokens": 96,
        "arms": {"draftsmith-all": {"overrides": ["drafter.anchors_per_sequence=0"], "tau_vs_speculators": 1.05},
                 "speculators": {"overrides": [], "peer": True}},
        "per_seed": {"0": {"draftsmith-all": figures, "speculators": figures | {"tau": 1.3}},
                     "1": {"draftsmith-all": figures, "speculators": figures | {"tau": 1.36}}}})
    assert ("| draftsmith-all | `drafter.anchors_per_sequence=0` | 0.30, 0.20, 0.10 / 0.30, 0.20, 0.10 | 1.37 / 1.37 | "
            "1.40 / 1.40 | 1.10× / 1.10× | 1.050× | 40/40 |") in text
    assert "| speculators | speculators' model, loss and optimiser |" in text and "1.30 / 1.36 |" in text
    assert "150 steps" in text and "up to 512 per batch" in text


# ----------------------------------------------------------------------------- a drafter named by content
def drafter_folder(folder: Path, weights: bytes = b"weights") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"draftsmith_kind": "eagle"}')
    (folder / "model.safetensors").write_bytes(weights)
    return folder


def test_a_drafter_hash_covers_its_weights_and_config_in_a_stable_order(tmp_path):
    folder = drafter_folder(tmp_path / "best")
    expected = hashlib.sha256(b"config.json\0" + b'{"draftsmith_kind": "eagle"}' + b"model.safetensors\0" + b"weights")
    assert records.drafter_sha256(folder) == expected.hexdigest()
    # files written in another order, and files that are not weights or config, give the same hash
    other = tmp_path / "copy"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"weights")
    (other / "config.json").write_text('{"draftsmith_kind": "eagle"}')
    (other / "README.md").write_text("a card")
    assert records.drafter_sha256(other) == records.drafter_sha256(folder)
    # other weights, or weights in a subfolder (a Medusa-2 export's tuned target), change it
    assert records.drafter_sha256(drafter_folder(tmp_path / "retrained", b"weights2")) != expected.hexdigest()
    drafter_folder(other / "target")
    assert records.drafter_sha256(other) != records.drafter_sha256(folder)
    # nothing to hash: no value invented
    assert records.drafter_sha256(tmp_path / "missing") is None
    assert records.drafter_sha256("no-such-owner/no-such-drafter") is None


def test_a_record_without_a_drafter_hash_renders_a_dash():
    text = rendered("hybrid", {"drafter": "runs/x/best", "prompts": "humaneval", "num_prompts": 2, "methods": {}})
    assert "`runs/x/best` (sha256 –)" in text
    text = rendered("hybrid", {"drafter": "runs/x/best", "drafter_sha256": "ab" * 32, "prompts": "humaneval",
                               "num_prompts": 2, "methods": {}})
    assert "(sha256 `abababababab`)" in text


# ----------------------------------------------------------------------------- the tree a run started from
def git(repo: Path, *arguments: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *arguments], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repository with one commit, and records' start-of-run state reset around the test."""
    monkeypatch.setattr(records, "_start", None)
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "code.py").write_text("x = 1\n")
    git(repo, "add", "code.py")
    git(repo, "commit", "-qm", "first")
    return repo


def test_a_run_is_credited_to_the_commit_it_started_from(repo):
    first = git(repo, "rev-parse", "HEAD")
    records.start(repo)
    (repo / "code.py").write_text("x = 2\n")  # a commit lands while the run measures
    git(repo, "commit", "-qam", "second")
    fields, diff = records.tree_fields()
    assert fields["commit"] == first and fields["dirty"] is False and diff == ""
    assert fields["tree_changed_during_run"] is True
    assert fields["commit_at_end"] == git(repo, "rev-parse", "HEAD") and fields["dirty_at_end"] is False
    line = results_page.tree_line({**entry("hybrid", {}), **fields, "date": "2026-12-03T11:00:00Z"})
    assert f"commit {first[:8]} at the start" in line and "the tree changed during the run" in line


def test_an_unchanged_tree_says_so_and_a_dirty_start_keeps_its_diff(repo, tmp_path, monkeypatch):
    (repo / "code.py").write_text("x = 3\n")  # uncommitted when the run starts
    records.start(repo)
    fields, diff = records.tree_fields()
    assert fields["dirty"] is True and fields["tree_changed_during_run"] is False
    assert "-x = 1" in diff and "+x = 3" in diff
    monkeypatch.setattr(records, "machine", lambda: MACHINE)
    path = records.write("hybrid", {"figure": 1}, results=tmp_path / "results")
    written = json.loads(path.read_text())
    assert written["dirty"] is True and written["diff"] == path.with_suffix(".diff").name
    assert path.with_suffix(".diff").read_text() == diff
    assert written["commit"] == git(repo, "rev-parse", "HEAD") and written["started"] <= written["date"]
    assert f"with uncommitted changes ([diff](../results/hybrid/{written['diff']}))" in results_page.tree_line(written)


# ----------------------------------------------------------------------------- goals over runs
def hybrid_run(date: str, hybrid: float, suffix: float = 1.0, drafter: float = 0.5) -> dict:
    methods = {"suffix": {"speedup_vs_plain": suffix}, "drafter": {"speedup_vs_plain": drafter},
               "hybrid": {"speedup_vs_plain": hybrid}}
    return entry("hybrid", {"drafter": "runs/x/best", "prompts": "humaneval", "num_prompts": 4, "methods": methods,
                            "per_category": {}, "checks": {"lossless": True}}, date=date, commit=date[8:10] * 20)


def goals_section(folder: Path) -> str:
    return render_results.render(folder).split('<a id="hybrid"></a>')[1].split("<a id=")[0]


def test_a_goal_needs_three_runs_for_a_verdict(tmp_path):
    write(tmp_path, hybrid_run("2026-12-03T00:00:00Z", 2.5))
    write(tmp_path, hybrid_run("2026-12-04T00:00:00Z", 2.6))
    section = goals_section(tmp_path)
    assert "| hybrid ÷ plain ≥ 2.2 | 2 | – | 2.50–2.60 | 2 of 2 | **not enough runs (n=2)** |" in section
    assert "met**" not in section and "missed**" not in section
    assert "This run: hybrid 2.60× plain and 2.600× the better single method; lossless: yes" in section


def test_a_goal_is_the_median_over_runs_with_its_spread_and_commits(tmp_path):
    for day, hybrid in (("03", 2.0), ("04", 2.3), ("05", 2.4)):
        write(tmp_path, hybrid_run(f"2026-12-{day}T00:00:00Z", hybrid, suffix=hybrid / 1.19))
    section = goals_section(tmp_path)
    assert "| hybrid ÷ plain ≥ 2.2 | 3 | 2.30 | 2.00–2.40 | 2 of 3 | **met** |" in section
    assert "| hybrid ÷ better single ≥ 1.2 | 3 | 1.19 | 1.19–1.19 | 0 of 3 | **missed** |" in section
    # every run, oldest first, with its commit and (not recorded then) drafter hash
    assert section.index("| 2026-12-03T00:00:00Z | 03030303 | – | 2.000 | 1.190 |") < section.index(
        "| 2026-12-05T00:00:00Z | 05050505 | – | 2.400 | 1.190 |")


def test_a_strict_goal_is_missed_at_its_threshold():
    goal = results_verdicts.Goal("x", lambda result: result["x"], 1.0, strict=True)
    runs = [{"result": {"x": 1.0}}, {"result": {"x": 1.0}}, {"result": {"x": 1.2}}]
    assert results_verdicts.verdict(goal, runs)["verdict"] == "missed"
    assert results_verdicts.verdict(goal, runs[1:] + [{"result": {"x": 1.1}}])["verdict"] == "met"


# ----------------------------------------------------------------------------- table cells stay short
def test_a_long_cell_becomes_a_note_below_its_table():
    prose = "a finding, " * 40
    lines = results_format.table(["lever", "what was found"], [["muon", prose], ["jsd", "lost"]])
    text = "\n".join(lines)
    assert "| muon | note 1 |" in text and "| jsd | lost |" in text
    assert text.index("| jsd | lost |") < text.index(f"Note 1: {prose}")
    assert results_format.long_cells(text) == []


def test_check_fails_on_a_rendered_cell_over_the_limit(tmp_path):
    page = tmp_path / "results.md"
    text = f"# x\n\n| a | b |\n|---|---|\n| 1 | {'y' * (results_format.CELL_LIMIT + 1)} |\n"
    page.write_text(text)
    assert results_format.long_cells(text) == [(5, results_format.CELL_LIMIT + 1)]
    assert render_results.check({page: text}, tmp_path) == 1
    short = text.replace("y" * (results_format.CELL_LIMIT + 1), "y" * 10)
    page.write_text(short)
    assert render_results.check({page: short}, tmp_path) == 0
