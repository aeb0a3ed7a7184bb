#!/usr/bin/env python3
"""Writes the tokenizer golden files of tests/data/golden/ with the reference tokenizer.

Reference: the `tokenizers` package (pinned in tools/requirements-test.txt) with
Tokenizer(BPE.from_file(vocab, merges)) and ByteLevel(add_prefix_space=False) pre-tokenisation
and decoding, i.e. GPT-2 byte-level BPE with `<|endoftext|>` not special (Megatron's behaviour).
Ill-formed UTF-8 reaches the reference as Python's bytes.decode("utf-8", errors="replace").

Outputs (ids are space-separated decimal on one line):
  stress.txt / stress.ids                  hand-made text: accents, CJK, emoji, combining marks,
                                           whitespace runs, contractions, numbers
  stress_invalid.bin / stress_invalid.ids  bytes with ill-formed UTF-8 sequences
  shakespeare_head.ids                     the first 20,000 bytes of tinyshakespeare.txt

Usage: .venv/bin/python tools/make_tokenizer_golden.py [--check]
  --check: regenerate in memory and fail if a committed file differs (used by the tests).
"""
import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "data" / "golden"
DATA = ROOT / "data"


def reference_tokenizer():
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    tok = Tokenizer(BPE.from_file(str(DATA / "gpt2-vocab.json"), str(DATA / "gpt2-merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def encode_bytes(tok, raw: bytes):
    return tok.encode(raw.decode("utf-8", errors="replace")).ids


STRESS = (
    "Héllo wörld! Ça va? Naïve café, résumé, Ångström, façade, jalapeño.\n"
    "東京は日本の首都です。北京欢迎你！한국어 텍스트도 있어요。\n"
    "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ ✨🔥\n"
    "Combining: e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937 Z\u0351\u0352\u0357a\u0334l\u0336g\u0338o\n"
    "Spaces:    four, \t\ttabs,\t \t mixed,  \n\n\n  newlines\r\n\r\nwindows   \n"
    "   leading and trailing   \n\u00a0nbsp\u2003em\u3000ideographic\u2028line\u2029para\u0085nel\n"
    "Contractions: I'm you're he's she'd we'll they've can't don't it's 'twas O'Neil's\n"
    "UPPER: I'M YOU'RE HE'S WE'LL THEY'VE\n"
    "Numbers: 0 7 42 1234567890 3.14159 -2.5e10 1,000,000 ١٢٣ ४५६ ½ ² Ⅻ\n"
    "Symbols: @#$%^&*()_+-=[]{}|;:',.<>/?`~ \\ \" …—–«»‹›„“”\n"
    "Mixed:abc123def 123abc ab12cd34 x=1;y=2 email@example.com https://example.org/a?b=c\n"
    "Code:\n    def f(x):\n        return x ** 2  # square\n\tif (a && b) { c++; }\n"
    "RTL: שלום עולם مرحبا بالعالم\n"
    "Greek/Cyrillic: Αλφάβητο Привет мир Ελληνικά\n"
    "Control: \x01\x02\x07\x1b[0m\x1c\x1d\x1e\x1f end\n"
    "Special text: <|endoftext|> stays text here.\n"
    "Long: " + "a" * 300 + " " + "ab" * 150 + " " + " " * 50 + "z" + "\n"
)

INVALID = (
    b"valid start \xff\xfe bad bytes, \xc3\x28 bad continuation, \xe2\x82 truncated 3-byte, "
    b"\xf0\x9f\x98 truncated 4-byte, \xed\xa0\x80 surrogate, \xc0\xaf overlong, \xf4\x90\x80\x80 too big, "
    b"\x80\x80 lone continuations, ok \xe2\x82\xac euro, end \xf0\x9f"
)


def outputs():
    tok = reference_tokenizer()
    stress = STRESS.encode("utf-8")
    head = (DATA / "tinyshakespeare.txt").read_bytes()[:20000]
    return {
        "stress.txt": stress,
        "stress.ids": (" ".join(map(str, encode_bytes(tok, stress))) + "\n").encode(),
        "stress_invalid.bin": INVALID,
        "stress_invalid.ids": (" ".join(map(str, encode_bytes(tok, INVALID))) + "\n").encode(),
        "shakespeare_head.ids": (" ".join(map(str, encode_bytes(tok, head))) + "\n").encode(),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    bad = []
    for name, content in outputs().items():
        path = GOLDEN / name
        if args.check:
            if not path.exists() or path.read_bytes() != content:
                bad.append(name)
        else:
            GOLDEN.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
    if bad:
        print("golden files differ from the reference: " + ", ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
