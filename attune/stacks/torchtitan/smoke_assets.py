"""Offline assets for smoke runs: a small BPE tokenizer and a small local text dataset that
torchtitan 0.3's HuggingFaceTokenizer and HuggingFaceTextDataLoader accept, with no hub access.

Shipped flat in attune/stacks/torchtitan/assets/ (under 1 MB): tokenizer.json and
tokenizer_config.json (a byte-level BPE of 2,000 tokens, below the 2,048 of torchtitan's debug
models), and smoke_text.json (JSON lines of {"text": ...}: docstrings of the Python standard
library, which every machine has and anyone may redistribute). `materialize` lays them out as the
two folders torchtitan reads; `build` regenerates the shipped files (a dev step, seconds).

Runs point at them with trial overrides: hf_assets_path (the tokenizer folder), dataloader.dataset
= c4_test (torchtitan's local-folder loader, text field "text") and dataloader.dataset_path.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

SHIPPED = Path(__file__).with_name("assets")
VOCAB_SIZE = 2000
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
CORPUS_BYTES = 600_000
# Env for runs on these assets: nothing may reach for the hub.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def materialize(dest: Path | str) -> dict[str, Any]:
    """Copy the shipped assets under dest as tokenizer/ and text/; returns the [config] overrides
    that point a torchtitan run at them."""
    dest = Path(dest)
    tokenizer_dir, text_dir = dest / "tokenizer", dest / "text"
    for folder, names in ((tokenizer_dir, ("tokenizer.json", "tokenizer_config.json")), (text_dir, ("smoke_text.json",))):
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            shutil.copyfile(SHIPPED / name, folder / ("train.json" if name == "smoke_text.json" else name))
    return {"hf_assets_path": str(tokenizer_dir), "dataloader.dataset": "c4_test",
            "dataloader.dataset_path": str(text_dir)}


# A fixed list (importing arbitrary modules has side effects: `this` prints, `antigravity` opens a browser).
CORPUS_MODULES = (
    "abc", "argparse", "ast", "asyncio", "base64", "bisect", "calendar", "collections", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "email.message", "enum",
    "fractions", "functools", "gzip", "hashlib", "heapq", "html.parser", "http.client", "inspect", "io",
    "ipaddress", "itertools", "json", "logging", "math", "operator", "os", "pathlib", "pickle", "random",
    "re", "shutil", "socket", "sqlite3", "statistics", "string", "subprocess", "tarfile", "tempfile",
    "textwrap", "threading", "typing", "unittest", "urllib.parse", "uuid", "xml.etree.ElementTree", "zipfile",
)


def _docstrings(limit_bytes: int) -> list[str]:
    """Paragraph-sized documents from standard-library docstrings, in a fixed order."""
    docs: list[str] = []
    for name in CORPUS_MODULES:
        module = importlib.import_module(name)
        objects = [module]
        for value in vars(module).values():
            if callable(value):
                objects.append(value)
                objects += [v for v in vars(value).values() if callable(v)] if isinstance(value, type) else []
        for obj in objects:
            text = getattr(obj, "__doc__", None)
            if isinstance(text, str) and len(text) >= 200:
                docs.append(" ".join(text.split()))
                if sum(map(len, docs)) >= limit_bytes:
                    return docs
    return docs


def build(dest: Path | str = SHIPPED) -> Path:
    """Regenerate the shipped corpus and train the tokenizer on it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # typing.io & co. warn when touched
        docs = list(dict.fromkeys(_docstrings(CORPUS_BYTES)))  # drop duplicates, keep order
    with (dest / "smoke_text.json").open("w") as out:
        for doc in docs:
            out.write(json.dumps({"text": doc}) + "\n")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(docs, trainer=trainer)
    tokenizer.save(str(dest / "tokenizer.json"))
    config = {"bos_token": BOS, "eos_token": EOS, "add_bos_token": False, "add_eos_token": False,
              "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast"}
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build or lay out ATTUNE's offline smoke-run assets.")
    parser.add_argument("--build", action="store_true", help=f"regenerate the shipped files in {SHIPPED}")
    parser.add_argument("--materialize", metavar="DIR", help="lay the assets out under DIR; print the overrides")
    args = parser.parse_args(argv)
    if args.build:
        build()
    if args.materialize:
        print(json.dumps(materialize(args.materialize)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
