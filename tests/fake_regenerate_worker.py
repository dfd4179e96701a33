"""A stand-in for draftsmith/data/regenerate_worker.py that speaks its protocol without vLLM
(tests/test_engine_regenerate.py).

    python tests/fake_regenerate_worker.py settings.json

It reads the target folder's tokenizer.json, logs every prompt it is sent as text (settings["seen"], one JSON line
per batch), and answers each prompt with "A(<the prompt's last user message>)" plus the stop token: an answer that
names what it was asked, so a test can see which turn saw which answer. settings["die_after"]: exit without a reply
on that batch (a crash in the middle of a run); settings["refuse"]: reply with an error instead of loading.
"""

import json
import os
import re
import sys
from pathlib import Path

from tokenizers import Tokenizer


def main(argv: list[str]) -> int:
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    settings = json.loads(Path(argv[0]).read_text())
    if settings.get("refuse"):
        protocol.write(json.dumps({"error": "ValueError: " + settings["refuse"]}) + "\n")
        protocol.flush()
        return 1
    tokenizer = Tokenizer.from_file(str(Path(settings["target"]) / "tokenizer.json"))
    protocol.write(json.dumps({"ready": True, "load_s": 0.0, "vllm_version": "fake"}) + "\n")
    protocol.flush()
    for number, line in enumerate(sys.stdin, start=1):
        if number == settings.get("die_after"):
            os._exit(3)
        batch = json.loads(line)
        texts = [tokenizer.decode(ids, skip_special_tokens=False) for ids in batch["prompts"]]
        with open(settings["seen"], "a") as seen:
            seen.write(json.dumps({"prompts": texts, "max_tokens": batch["max_tokens"],
                                   "temperature": batch["temperature"], "seeds": batch["seeds"]}) + "\n")
        asked = [re.findall(r"user\n(.*?)<\|im_end\|>", text, flags=re.S)[-1] for text in texts]
        outputs = [tokenizer.encode(f"A({question})", add_special_tokens=False).ids[:batch["max_tokens"] - 1]
                   + batch["stop_token_ids"] for question in asked]
        protocol.write(json.dumps({"outputs": outputs, "seconds": 0.0}) + "\n")
        protocol.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
