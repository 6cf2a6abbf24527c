"""Convert one Hugging Face Llama-format model directory to GGUF with llama.cpp's own converter.

Runs inside the conversion venv that convert.sh makes (torch, transformers and llama.cpp's gguf-py;
none of them enter the project's environment):

    python gguf_convert.py LLAMA_CPP_SRC MODEL_DIR OUTFILE {f32,bf16}

llama.cpp's converter names a byte-level BPE tokenizer's pre-tokenizer by hashing how it splits a
fixed text, and refuses hashes it does not know; ours (trained by quickdraft.train) is unknown to
it. Its pre-tokenizer is GPT-2's (ByteLevel with the GPT-2 regex), so this wrapper names it
"gpt-2" instead of editing the vendored converter. It then checks that the written file does not
ask llama.cpp to add a BOS token, so that llama.cpp tokenizes a prompt as quickdraft does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

GPT2_PRE_TOKENIZER = "gpt-2"


def is_gpt2_byte_level(model_dir: Path) -> bool:
    """True when tokenizer.json pre-tokenizes as GPT-2 does: ByteLevel with its built-in regex and
    no prefix space."""
    pre = json.loads((model_dir / "tokenizer.json").read_text()).get("pre_tokenizer") or {}
    return (pre.get("type") == "ByteLevel" and pre.get("use_regex", True)
            and not pre.get("add_prefix_space", False))


def name_gpt2_pre_tokenizer(model_dir: Path) -> None:
    """Wrap the converter's hash lookup: a hash it knows keeps its name; an unknown one on a
    GPT-2-style tokenizer becomes "gpt-2"; anything else still fails as the converter would."""
    from conversion import base

    lookup = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self: Any, tokenizer: Any) -> str:
        try:
            return lookup(self, tokenizer)
        except NotImplementedError:
            if not is_gpt2_byte_level(model_dir):
                raise
            print(f"(the warning above is expected: {model_dir}/tokenizer.json pre-tokenizes as GPT-2 does, "
                  f"so the pre-tokenizer is named {GPT2_PRE_TOKENIZER!r})", file=sys.stderr)
            return GPT2_PRE_TOKENIZER

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre


def check_no_bos(outfile: Path) -> None:
    import gguf

    reader = gguf.GGUFReader(str(outfile))
    add_bos = reader.get_field(gguf.Keys.Tokenizer.ADD_BOS)
    if add_bos is not None and add_bos.contents():
        raise SystemExit(f"{outfile}: tokenizer.ggml.add_bos_token is true; llama.cpp would prepend a BOS "
                         "token that quickdraft does not (set add_bos_token false in tokenizer_config.json)")
    pre = reader.get_field(gguf.Keys.Tokenizer.PRE)
    print(f"{outfile}: tokenizer.ggml.pre={pre.contents() if pre else None}, "
          f"add_bos_token={add_bos.contents() if add_bos else 'unset'}")


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[3] not in ("f32", "bf16"):
        print(__doc__, file=sys.stderr)
        return 2
    source, model_dir, outfile, outtype = Path(argv[0]), Path(argv[1]), Path(argv[2]), argv[3]
    sys.path[:0] = [str(source), str(source / "gguf-py")]  # the converter imports its siblings
    name_gpt2_pre_tokenizer(model_dir)
    import convert_hf_to_gguf

    outfile.parent.mkdir(parents=True, exist_ok=True)
    sys.argv = ["convert_hf_to_gguf.py", str(model_dir), "--outfile", str(outfile), "--outtype", outtype]
    convert_hf_to_gguf.main()
    check_no_bos(outfile)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
