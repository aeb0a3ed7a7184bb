"""SentencePiece and Hugging Face tokenizer.json tokenizers through `loom preprocess`, against
the reference libraries on a multilingual text (docs/design/tokenizers.md):

- a tiny SentencePiece model (unigram and BPE) trained here with the `sentencepiece` package:
  ids equal `SentencePieceProcessor.encode(text)`, plus the model's eos with --append-eod;
- small byte-level BPE tokenizer.json files trained here with `tokenizers`: GPT-NeoX's layout
  (NFC normalizer, ByteLevel pre-tokenizer) and Llama 3's (Split regex + ByteLevel without
  regex, ignore_merges), with and without add_prefix_space: ids equal
  `Tokenizer.encode(text, add_special_tokens=False).ids`;
- a tokenizer file that does not parse exits 2 naming it;
- end to end, a model trained on a SentencePiece recipe and one on a tokenizer.json recipe:
  the vocabulary is the tokenizer's size padded, and `loom generate`, `loom serve` and
  `loom eval` read the tokenizer from the run's recipe, with the reference's ids.
"""
import io
import json
import pathlib
import subprocess
import warnings

import pytest

from test_data_helpers import DATA, ROOT, loom_binary, preprocess, read_indexed

warnings.filterwarnings("ignore")

MULTILINGUAL = [
    "The quick brown fox jumps over the lazy dog. It's 12:30, isn't it? I'll say 3.14159!",
    "Grüße aus München: Äpfel, Öl und Übermut kosten 5 €.",
    "Ça a été une journée très agréable à Noël, n'est-ce pas ?",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "我能吞下玻璃而不伤身体。今天天气很好，我们去公园吧！",
    "いろはにほへと ちりぬるを わかよたれそ つねならむ。カタカナも。",
    "نص عربي للاختبار مع أرقام ١٢٣ و 456.",
    "हिन्दी में परीक्षण पाठ, संख्या २०२४।",
    "한국어 문장도 있습니다. 감사합니다!",
    "Emoji 🙂🚀 and combining e\u0301 vs \u00e9, ﬁ ligature, full-width ＡＢＣ１２３.",
    "Tabs\tand  double  spaces\n\nnew lines   \n trailing   ",
    "code: def f(x):\n    return x ** 2  # ok",
    "A special <|endoftext|> inside the text, then more.",
]


def training_text():
    text = (DATA / "tinyshakespeare.txt").read_text(encoding="utf-8")[:200000]
    return [l for l in text.split("\n") if l.strip()] + MULTILINGUAL * 20


def write_docs(path):
    with open(path, "w", encoding="utf-8") as f:
        for d in MULTILINGUAL:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")


@pytest.fixture(scope="module")
def docs_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("docs") / "multi.jsonl"
    write_docs(path)
    return path


def train_sentencepiece(path, model_type):
    """A SentencePiece model of 800 pieces trained on the test text, written to `path`."""
    import sentencepiece as spm
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(training_text()), model_writer=model, vocab_size=800,
                                   model_type=model_type, character_coverage=1.0, byte_fallback=True,
                                   num_threads=1, minloglevel=2)
    path.write_bytes(model.getvalue())
    return spm.SentencePieceProcessor(model_file=str(path))


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_sentencepiece_ids_equal_the_reference(tmp_path, docs_file, model_type):
    path = tmp_path / "tiny.model"
    sp = train_sentencepiece(path, model_type)
    r = preprocess(docs_file, tmp_path / "sp", "--append-eod", "--tokenizer-library", "sentencepiece",
                   "--tokenizer-model", str(path))
    assert r.returncode == 0, r.stderr
    seqs, _ = read_indexed(tmp_path / "sp_text_document")
    want = [sp.encode(d) + [sp.eos_id()] for d in MULTILINGUAL]
    assert [s.tolist() for s in seqs] == want
    assert (tmp_path / "sp_text_document.idx").read_bytes()[17] == 8  # uint16 for 800 entries


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def train_hf(flavor, add_prefix_space):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    if flavor == "neox":
        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    else:
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=["<|endoftext|>", "<|padding|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(training_text(), trainer=trainer)
    return tok


@pytest.mark.parametrize("flavor,add_prefix_space", [("neox", False), ("neox", True), ("llama3", False)])
def test_tokenizer_json_ids_equal_the_reference(tmp_path, docs_file, flavor, add_prefix_space):
    tok = train_hf(flavor, add_prefix_space)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    r = preprocess(docs_file, tmp_path / "hf", "--append-eod", "--tokenizer-library", "huggingface",
                   "--tokenizer-model", str(tmp_path))  # the folder holding tokenizer.json
    assert r.returncode == 0, r.stderr
    seqs, _ = read_indexed(tmp_path / "hf_text_document")
    eod = tok.token_to_id("<|endoftext|>")
    want = [tok.encode(d, add_special_tokens=False).ids + [eod] for d in MULTILINGUAL]
    bad = [i for i, (s, w) in enumerate(zip(seqs, want)) if s.tolist() != w]
    assert not bad, [(MULTILINGUAL[i], seqs[i].tolist(), want[i]) for i in bad[:2]]


def test_tokenizer_files_that_do_not_parse(tmp_path, docs_file):
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": ')
    r = preprocess(docs_file, tmp_path / "x", "--tokenizer-library", "huggingface",
                   "--tokenizer-model", str(tmp_path / "tokenizer.json"))
    assert r.returncode == 2 and "tokenizer.json" in r.stderr and "not valid JSON" in r.stderr, r.stderr
    (tmp_path / "wp.json").write_text(json.dumps({"model": {"type": "WordPiece", "vocab": {}}, "pre_tokenizer": None}))
    r = preprocess(docs_file, tmp_path / "x", "--tokenizer-library", "huggingface",
                   "--tokenizer-model", str(tmp_path / "wp.json"))
    assert r.returncode == 2 and "wp.json" in r.stderr and "WordPiece" in r.stderr, r.stderr
    (tmp_path / "junk.model").write_bytes(b"this is not a protobuf \x00\xff" * 10)
    r = preprocess(docs_file, tmp_path / "x", "--tokenizer-library", "sentencepiece",
                   "--tokenizer-model", str(tmp_path / "junk.model"))
    assert r.returncode == 2 and "junk.model" in r.stderr, r.stderr
    assert not list(tmp_path.glob("x_*"))


E2E_PROMPT = "ROMEO: Grüße aus München, друг!"


@pytest.mark.parametrize("library", ["sentencepiece", "huggingface"])
def test_a_recipe_tokenizer_trains_generates_serves_and_evaluates(tmp_path, library):
    """Train 4 steps on a recipe whose model.tokenizer is a SentencePiece model or a
    tokenizer.json: the model's vocabulary is the tokenizer's (800 or 1500 + specials) padded
    to 128; `loom generate` prompts with the reference's ids; `loom serve` answers with them
    and its text decodes them as the reference does; `loom eval` scores every token of the
    reference's encoding of a rolling document."""
    import requests
    from serve_helpers import Server
    from train_helpers import load_shard, run_train, tiny_overrides
    if library == "sentencepiece":
        model = tmp_path / "spm.model"
        sp = train_sentencepiece(model, "unigram")
        encode, decode, vocab = sp.encode, sp.decode, sp.get_piece_size()
    else:
        tok = train_hf("neox", False)
        model = tmp_path / "tokenizer.json"
        tok.save(str(model))
        encode = lambda text: tok.encode(text, add_special_tokens=False).ids
        decode = lambda ids: tok.decode(ids, skip_special_tokens=False)
        vocab = tok.get_vocab_size()
    flags = ("--tokenizer-library", library, "--tokenizer-model", str(model))
    done = preprocess(DATA / "tinyshakespeare.txt", tmp_path / "corpus", "--append-eod", *flags)
    assert done.returncode == 0, done.stderr
    run = tmp_path / "run"
    run_train(tiny_overrides(str(tmp_path / "corpus_text_document"), run, steps=4, global_batch=4,
                             extra=[f"model.tokenizer.library={library}", f"model.tokenizer.model={model}",
                                    "model.tokenizer.type=null"]))
    shard = load_shard(run / "checkpoints" / "iter_0000004" / "mp_rank_00" / "model_optim_rng.pt")
    # the parameter and its optimizer state (main, exp_avg, exp_avg_sq) all have the padded rows
    rows = [v.shape[0] for k, v in flat(shard).items() if k.endswith("word_embeddings.weight")]
    assert len(rows) == 4 and set(rows) == {-(-vocab // 128) * 128}, rows

    prompt_ids = encode(E2E_PROMPT)
    # The server refuses prompt + new tokens past the 32-token context (generate would take one
    # more: its last token is never fed back), so both are asked for what the server accepts.
    new_tokens = min(6, 32 - len(prompt_ids))
    assert new_tokens >= 1, len(prompt_ids)
    gen = subprocess.run([str(loom_binary()), "generate", "--checkpoint", str(run), "--prompt", E2E_PROMPT,
                          "--max-new-tokens", str(new_tokens), "--greedy"], cwd=ROOT, capture_output=True, text=True,
                         errors="replace", timeout=300)
    assert gen.returncode == 0, gen.stderr
    assert f"{len(prompt_ids)} prompt tokens" in gen.stderr, gen.stderr
    assert gen.stdout.startswith(E2E_PROMPT)

    with Server(run) as server:
        out = requests.put(server.url + "/generate", json={"sentences": [E2E_PROMPT], "tokens_to_generate": new_tokens,
                                                           "greedy": True}, timeout=120).json()
    assert "token_ids" in out, out
    ids = out["token_ids"][0]
    assert ids[:len(prompt_ids)] == prompt_ids and len(prompt_ids) < len(ids) <= len(prompt_ids) + new_tokens, ids
    # Generated bytes that end inside a UTF-8 character are replaced by each side its own way.
    if "\ufffd" not in out["sentences"][0]:
        assert out["sentences"][0] == gen.stdout[:-1] == decode(ids)

    text = " ".join(MULTILINGUAL[:6])
    (tmp_path / "pages.jsonl").write_text(json.dumps({"text": text}, ensure_ascii=False) + "\n", encoding="utf-8")
    ev = subprocess.run([str(loom_binary()), "eval", "--checkpoint", str(run), "--tasks",
                         f"pages=rolling:{tmp_path / 'pages.jsonl'}", "--bootstrap-iters", "0", "--output",
                         str(tmp_path / "eval.json"), "--log-samples"], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
    assert ev.returncode == 0, ev.stderr
    sample = json.loads((tmp_path / "eval_samples_pages.jsonl").read_text().splitlines()[0])
    assert sample["tokens"] == len(encode(text)), sample


def flat(tree, prefix=""):
    """A nested checkpoint dictionary as {dotted name: tensor}."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        elif hasattr(v, "shape"):
            out[f"{prefix}{k}"] = v
    return out
