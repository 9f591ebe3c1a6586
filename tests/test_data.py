import builtins
import functools
import hashlib
import inspect
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tiktoken
import torch

import data
from conftest import BPE_TEXT, ROOT, refused, small_bpe_encoding

TEXT = "Héllo, wörld — 日本語 🙂\n\tdef f(x):\n    return x ** 2  # <|endoftext|> stays plain text\r\n"


def entropy_by_hand(tokens):
    counts = Counter(tokens)
    n = len(tokens)
    return -sum(c / n * math.log(c / n) for c in counts.values())


def read_bin(path, dtype):
    return np.fromfile(path, dtype=dtype).tolist()


def test_byte_tokenizer_ids_are_utf8_bytes_and_round_trip():
    enc = data.get_tokenizer("byte")
    ids = enc.encode_ordinary(TEXT)
    assert ids == list(TEXT.encode("utf-8"))
    assert enc.decode(ids) == TEXT
    assert enc.n_vocab == 256


def test_byte_fast_path_equals_tiktoken():
    rng = random.Random(3)
    # every byte value's character, multibyte letters, emoji, CRLF, a special token's text and random code points
    sample = TEXT + "".join(map(chr, range(256))) + "".join(chr(rng.randrange(0x20, 0x2FFFF)) for _ in range(2000))
    sample = sample.encode("utf-8", "replace").decode("utf-8")  # drop lone surrogates: files never hold them
    enc = data.get_tokenizer("byte")
    ids = data.encode(enc, sample)
    assert ids.tolist() == enc.encode_ordinary(sample)
    assert len(ids) > len(sample)  # the sample has multibyte characters


def test_gpt2_tokenizer(gpt2_ranks):
    enc = data.get_tokenizer("gpt2")
    assert enc.encode_ordinary("hello world") == [31373, 995]
    assert enc.n_vocab == 50257
    ids = enc.encode_ordinary(TEXT)
    assert 50256 not in ids  # "<|endoftext|>" in the text is not the special token
    assert enc.decode(ids) == TEXT


def test_gpt2_without_ranks_is_a_data_error(tmp_path, monkeypatch):
    downloads = []

    def offline(blobpath):
        downloads.append(blobpath)
        raise ConnectionError(f"no network in this test: {blobpath}")

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # empty: no cached ranks
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # forget encodings loaded by earlier tests
    monkeypatch.setattr(tiktoken.load, "read_file", offline)  # what tiktoken calls to download
    with pytest.raises(data.DataError) as e:
        data.get_tokenizer("gpt2")
    assert "TIKTOKEN_CACHE_DIR" in str(e.value) and "\n" not in str(e.value)
    assert downloads  # the cache was missed and the download was the stub, not the network


@pytest.mark.parametrize("variable", ["TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR", None])
def test_the_cache_file_is_where_tiktoken_reads_it(tmp_path, monkeypatch, variable):
    """data.tiktoken_cache_file names the file tiktoken's own cached read returns, for each way of setting it."""
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    monkeypatch.delenv("DATA_GYM_CACHE_DIR", raising=False)
    if variable:
        monkeypatch.setenv(variable, str(tmp_path))
    else:
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = Path(data.tiktoken_cache_file(data.GPT2_RANKS_URL))
    assert tmp_path in path.parents
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"what the cache holds")
    monkeypatch.setattr(tiktoken.load, "read_file", lambda blobpath: b"the network, which the cache spares")
    assert tiktoken.load.read_file_cached(data.GPT2_RANKS_URL) == b"what the cache holds"


def test_the_first_gpt2_use_says_in_one_line_what_it_downloads_and_where(tmp_path, monkeypatch, capsys):
    """The download is tiktoken's (stood in for here: it fills the cache and returns a small BPE); data.py says it in
    one line on stderr the first time, and nothing once the ranks are cached."""
    def download_and_cache(name):
        assert name == "r50k_base"
        Path(data.tiktoken_cache_file(data.GPT2_RANKS_URL)).write_bytes(b"ranks")
        return small_bpe_encoding()

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiktoken, "get_encoding", download_and_cache)
    assert data.get_tokenizer("gpt2") is small_bpe_encoding()
    assert capsys.readouterr().err == f"downloaded GPT-2's BPE ranks (r50k_base, 0.8 MB) once; cached in {tmp_path}\n"
    assert data.get_tokenizer("gpt2") is small_bpe_encoding()
    assert capsys.readouterr().err == ""


def test_a_damaged_or_missing_cached_copy_of_gpt2s_ranks_is_named_with_what_to_do(tmp_path, monkeypatch):
    """Issue 55: TIKTOKEN_CACHE_DIR naming a damaged copy of GPT-2's ranks was told to set TIKTOKEN_CACHE_DIR.
    tiktoken removes a copy whose sha256 is not the ranks' and downloads them again, which fails offline."""
    def offline(blobpath):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken.load, "read_file", offline)
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # r50k_base as if not yet loaded in this process
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    cache = Path(data.tiktoken_cache_file(data.GPT2_RANKS_URL))
    cache.write_bytes(b"half a file of ranks")
    with pytest.raises(data.DataError) as error:
        data.get_tokenizer("gpt2")
    assert str(error.value) == (f"could not load the gpt2 tokenizer (ConnectionError): {cache}, tiktoken's cached copy "
                                "of GPT-2's ranks, was damaged (not their sha256), and tiktoken removed it to download "
                                f"them (0.8 MB) again; put a good copy at {cache}, or run once with the network "
                                "(docs/scale.md: GPT-2's BPE)")
    assert not cache.exists()
    with pytest.raises(data.DataError) as error:  # now the folder holds none
        data.get_tokenizer("gpt2")
    assert str(error.value) == (f"could not load the gpt2 tokenizer (ConnectionError), whose ranks (0.8 MB) it "
                                f"downloads once; TIKTOKEN_CACHE_DIR={tmp_path} holds no copy of them ({cache}): "
                                "offline, put them there (docs/scale.md: GPT-2's BPE)")


def test_small_bpe_merges_bytes_and_round_trips():
    """The tests' stand-in for GPT-2's BPE is a real byte-pair encoding: merges shorten its own text, and any text,
    bytes it never saw included, decodes back."""
    enc = small_bpe_encoding()
    assert enc.n_vocab == 301 and enc.encode("<|endoftext|>", allowed_special="all") == [300]
    assert len(enc.encode_ordinary(BPE_TEXT)) < len(BPE_TEXT.encode()) / 2
    assert enc.decode(enc.encode_ordinary(TEXT)) == TEXT


def test_unknown_tokenizer_lists_the_choices():
    with pytest.raises(data.DataError, match="byte, gpt2"):
        data.get_tokenizer("sentencepiece")


def test_token_dtype():
    assert data.token_dtype(256) == np.uint16
    assert data.token_dtype(50257) == np.uint16
    assert data.token_dtype(65536) == np.uint16  # largest id 65535 still fits
    assert data.token_dtype(65537) == np.uint32
    assert data.token_dtype(100277) == np.uint32


def test_uint32_folder_round_trips_through_get_batch(tmp_path, monkeypatch):
    # no shipped tokenizer needs uint32, so force it to check that meta.json and get_batch follow the dtype
    monkeypatch.setattr(data, "token_dtype", lambda vocab_size: np.uint32)
    src = tmp_path / "corpus.txt"
    src.write_text("abcdefghij" * 10)
    folder = data.prepare(str(src), "byte", data_dir=str(tmp_path / "data"))
    assert data.load_meta(folder)["dtype"] == "uint32"
    assert (Path(folder) / "train.bin").stat().st_size == 4 * 90
    x, y = data.get_batch(folder, "train", 4, 10, torch.Generator().manual_seed(0), "cpu")
    assert bytes(x[0].tolist()) in b"abcdefghij" * 9 and torch.equal(y[:, :-1], x[:, 1:])


def test_prepare_file(tmp_path):
    text = (TEXT * 20)[:500]
    corpus = text.encode("utf-8")
    src = tmp_path / "corpus.txt"
    src.write_bytes(corpus)
    folder = Path(data.prepare(str(src), "byte", data_dir=str(tmp_path / "data")))
    assert folder.parent == tmp_path / "data" and folder.name.startswith("corpus.txt-")
    n = len(corpus)
    n_train = n * 9 // 10
    assert (folder / "train.bin").stat().st_size == 2 * n_train  # two bytes a token: uint16
    assert (folder / "val.bin").stat().st_size == 2 * (n - n_train)
    train = read_bin(folder / "train.bin", np.uint16)
    val = read_bin(folder / "val.bin", np.uint16)
    assert bytes(train + val) == corpus
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["source"]["sha256"] == hashlib.sha256(corpus).hexdigest()
    assert folder.name.endswith(f"-byte-{meta['source']['sha256'][:12]}")  # keyed on the text
    assert meta["tokenizer"] == "byte" and meta["vocab_size"] == 256 and meta["dtype"] == "uint16"
    assert meta["train_tokens"] == n_train and meta["val_tokens"] == n - n_train
    assert meta["source"]["path"] == str(src) and meta["source"]["files"] == 1
    assert meta["unigram_entropy"] == pytest.approx(entropy_by_hand(list(corpus[n_train:])), rel=1e-12)
    assert data.load_meta(folder) == meta


def test_prepare_file_gpt2(tmp_path, small_bpe):
    src = tmp_path / "corpus.txt"
    src.write_text(TEXT * 30, encoding="utf-8")
    folder = data.prepare(str(src), "gpt2", data_dir=str(tmp_path / "data"))
    meta = data.load_meta(folder)
    assert meta["vocab_size"] == small_bpe.n_vocab and meta["dtype"] == "uint16"
    train = read_bin(Path(folder) / "train.bin", np.uint16)
    val = read_bin(Path(folder) / "val.bin", np.uint16)
    assert train + val == small_bpe.encode_ordinary(TEXT * 30) and small_bpe.decode(train + val) == TEXT * 30
    assert meta["train_tokens"] == len(train) and meta["val_tokens"] == len(val)
    assert len(train) == (len(train) + len(val)) * 9 // 10
    assert meta["unigram_entropy"] == pytest.approx(entropy_by_hand(val), rel=1e-12)


def test_prepare_folder_joins_sorted_text_files_and_names_a_binary_file_it_skips(tmp_path, capsys):
    root = tmp_path / "books"
    (root / "sub").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "a.txt").write_text("alpha Ω\n", encoding="utf-8")
    (root / "sub" / "b.md").write_text("beta", encoding="utf-8")
    (root / "z.txt").write_text("zeta 🙂", encoding="utf-8")
    (root / ".hidden.txt").write_text("hidden", encoding="utf-8")
    (root / ".git" / "config").write_text("hidden too", encoding="utf-8")
    (root / "blob.bin").write_bytes(b"ab\x00cd")  # valid UTF-8 but binary
    folder = data.prepare(str(root), "byte", data_dir=str(tmp_path / "data"))
    meta = data.load_meta(folder)
    tokens = read_bin(Path(folder) / "train.bin", np.uint16) + read_bin(Path(folder) / "val.bin", np.uint16)
    assert bytes(tokens).decode("utf-8") == "alpha Ω\n\nbeta\nzeta 🙂"
    assert meta["source"]["files"] == 3 and meta["source"]["skipped"] == 1
    assert capsys.readouterr().err == (f"note: --dataset={root}: 1 binary file skipped (NUL bytes, not text): "
                                       f"{root / 'blob.bin'}\n")


def test_a_folder_with_a_text_file_in_another_encoding_is_refused_naming_it(tmp_path):
    """Issue 55: a folder of one UTF-8 and one latin-1 file trained on the UTF-8 one alone, without a word."""
    root = tmp_path / "books"
    root.mkdir()
    (root / "a.txt").write_text("café au lait\n" * 10, encoding="utf-8")
    (root / "b.txt").write_bytes("café au lait\n".encode("latin-1") * 10)
    with pytest.raises(data.DataError) as error:
        data.prepare(str(root), "byte", data_dir=str(tmp_path / "data"))
    assert str(error.value) == (f"--dataset={root}: {root / 'b.txt'} is not UTF-8 text (byte 3 (0xe9) is not UTF-8, "
                                "nor are 9 more bytes: text in a one-byte encoding such as latin-1; convert it to "
                                "UTF-8, e.g. iconv -f latin1 -t utf-8)")
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("made, says", [
    ({"run.lock": b"", "config.json": b"{}", "log.jsonl": b"{}\n", "ckpt.pt": b"PK\x00"},
     "{root} is a nanonorm run's folder"),
    ({"config.json": b"{}", "log.jsonl": b"{}\n"}, "{root} is a nanonorm run's folder"),
    ({"notes.txt": b"text\n", "sweep/a/1e-2/0/run.lock": b"", "sweep/a/1e-2/0/config.json": b"{}"},
     "{root} holds {root}/sweep/a/1e-2/0, which is a nanonorm run's folder"),
    ({"x-byte-0123456789ab/meta.json": b"{}", "x-byte-0123456789ab/train.bin": b"\x00\x01"},
     "{root} holds {root}/x-byte-0123456789ab, which is data nanonorm prepared"),
], ids=["run folder", "run folder without run.lock", "sweep folder", "prepared data"])
def test_a_run_folder_or_prepared_data_is_not_a_corpus(tmp_path, made, says):
    """Issue 55: --dataset=OUT (a run's folder) trained on its config.json and log.jsonl and skipped its checkpoints
    without a word."""
    root = tmp_path / "given"
    for name, content in made.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    with pytest.raises(data.DataError) as error:
        data.prepare(str(root), "byte", data_dir=str(tmp_path / "data"))
    assert str(error.value).startswith(f"--dataset={says.format(root=root)}")
    assert str(error.value).endswith("not a corpus; give a text file or a folder of text files")


RACE = """
import sys, time
from pathlib import Path
import data
ready, name, log, dataset, data_dir = sys.argv[1:]
(Path(ready) / name).touch()
while len(list(Path(ready).iterdir())) < 2:  # start both preparations together
    time.sleep(0.01)
encode = data.encode
def logged_encode(enc, text):
    with open(log, "a") as f:
        f.write(name + "\\n")
    time.sleep(1.5)  # hold the lock long enough for the other process to reach it
    return encode(enc, text)
data.encode = logged_encode
print(data.prepare(dataset, "byte", data_dir))
"""


@pytest.mark.slow
def test_concurrent_prepare_tokenizes_once(tmp_path):
    corpus = (TEXT * 40).encode("utf-8")
    (tmp_path / "corpus.txt").write_bytes(corpus)
    (tmp_path / "ready").mkdir()
    log = tmp_path / "encoded.log"
    procs = [subprocess.Popen([sys.executable, "-c", RACE, str(tmp_path / "ready"), str(i), str(log),
                               str(tmp_path / "corpus.txt"), str(tmp_path / "data")],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert len(log.read_text().splitlines()) == 1  # one process tokenized, the other waited and found it
    assert outs[0][0] == outs[1][0]
    folder = Path(outs[0][0].strip())
    n_train = len(corpus) * 9 // 10
    assert bytes(read_bin(folder / "train.bin", np.uint16) + read_bin(folder / "val.bin", np.uint16)) == corpus
    assert data.load_meta(folder)["train_tokens"] == n_train
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "train.bin", "val.bin"]


def test_a_single_file_must_be_utf8_text(tmp_path):
    for name, content in (("latin1.txt", "café\n".encode("latin-1")), ("blob.txt", b"ab\x00cd\n")):
        (tmp_path / name).write_bytes(content * 10)
        with pytest.raises(data.DataError, match="is not UTF-8 text"):
            data.prepare(str(tmp_path / name), data_dir=str(tmp_path / "data"))
    assert not (tmp_path / "data").exists()  # a bad corpus writes nothing, not even the lock file


@pytest.mark.parametrize("encoding, advice", [
    ("utf-16", "it is UTF-16 text; convert it to UTF-8, e.g. iconv -f utf-16 -t utf-8"),
    ("utf-16-be", "it is UTF-16 text; convert it to UTF-8, e.g. iconv -f utf-16 -t utf-8"),
    ("utf-32", "it is UTF-32 text; convert it to UTF-8, e.g. iconv -f utf-32 -t utf-8"),
    ("latin-1", "byte 3 (0xe9) is not UTF-8, nor are 19 more bytes: text in a one-byte encoding such as latin-1; "
                "convert it to UTF-8, e.g. iconv -f latin1 -t utf-8"),
    (None, "it holds a NUL byte at byte 0: a binary file, not text; give a text file"),
])
def test_a_file_that_is_not_utf8_is_told_what_it_is(tmp_path, encoding, advice):
    """Issue 46: a UTF-16 corpus was told to use iconv -f latin1, which would turn its NUL bytes into text."""
    path = tmp_path / "corpus.txt"
    path.write_bytes("Café au lait\n".encode(encoding) * 20 if encoding else bytes(range(256)) * 4)
    with pytest.raises(data.DataError) as error:
        data.prepare(str(path), data_dir=str(tmp_path / "data"))
    assert str(error.value) == f"--dataset={path}: {path} is not UTF-8 text ({advice})"


UTF8 = "Café au lait, naïve\n".encode("utf-8") * 20  # 440 bytes, 40 characters beyond ASCII


@pytest.mark.parametrize("content, advice", [
    (UTF8[:100] + b"\xe9" + UTF8[100:], "byte 100 (0xe9) is not UTF-8, in a file of 40 UTF-8 characters beyond "
     "ASCII: stray bytes, not another encoding (iconv -f latin1 would turn each \"é\" into \"Ã©\"); fix or remove "
     "them (iconv -c -f utf-8 -t utf-8 drops them)"),
    (UTF8 + "é".encode("utf-8")[:1], "its last character, from byte 440, is cut off: a UTF-8 file cut short; drop its "
     "last byte (head -c 440) or restore its end"),
    (UTF8 + "🙂".encode("utf-8")[:3], "its last character, from byte 440, is cut off: a UTF-8 file cut short; drop "
     "its last 3 bytes (head -c 440) or restore its end"),
    (b"x" * 5000 + b"\x00" + b"y" * 10, "it holds a NUL byte at byte 5000: a binary file, not text; give a text file"),
], ids=["stray byte", "cut-off 2-byte character", "cut-off 4-byte character", "NUL past 4 KB"])
def test_a_utf8_file_with_a_stray_byte_or_a_cut_off_end_is_told_where(tmp_path, content, advice):
    """Issue 55: a UTF-8 file with one stray byte, or cut short in its last character, was told to convert from
    latin-1, which turns each of its "é" into "Ã©", without the byte's offset; a NUL byte past the first 4 KB was
    called latin-1 too."""
    path = tmp_path / "corpus.txt"
    path.write_bytes(content)
    with pytest.raises(data.DataError) as error:
        data.prepare(str(path), data_dir=str(tmp_path / "data"))
    assert str(error.value) == f"--dataset={path}: {path} is not UTF-8 text ({advice})"


def test_load_meta_checks_the_bin_sizes_and_changes_nothing(letters):
    folder, corpus = letters
    train_bin = Path(folder) / "train.bin"
    original = train_bin.read_bytes()
    train_bin.write_bytes(original[:-2])  # one token short
    with pytest.raises(data.DataError) as e:
        data.prepare(str(Path(folder).parent.parent / "letters.txt"), "byte", str(Path(folder).parent))
    assert "train.bin has" in str(e.value) and "delete the folder" in str(e.value) and "\n" not in str(e.value)
    assert train_bin.read_bytes() == original[:-2]


def test_same_basename_different_paths_do_not_collide(tmp_path):
    for d in ("one", "two"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "corpus.txt").write_text(f"text of {d}\n" * 5)
    one = data.prepare(str(tmp_path / "one" / "corpus.txt"), data_dir=str(tmp_path / "data"))
    two = data.prepare(str(tmp_path / "two" / "corpus.txt"), data_dir=str(tmp_path / "data"))
    assert one != two
    assert data.load_meta(one)["source"]["path"] != data.load_meta(two)["source"]["path"]


def test_an_edited_corpus_is_prepared_anew_and_an_unchanged_one_is_not_read(tmp_path, monkeypatch):
    src = tmp_path / "corpus.txt"
    src.write_text("first version\n" * 10)
    first = data.prepare(str(src), data_dir=str(tmp_path / "data"))
    src.write_text("second, longer version\n" * 10)
    second = data.prepare(str(src), data_dir=str(tmp_path / "data"))
    assert second != first and Path(first).is_dir()  # the old folder stays, for the runs that use it
    assert data.load_meta(second)["train_tokens"] + data.load_meta(second)["val_tokens"] == 230
    assert data.load_meta(second)["source"]["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    monkeypatch.setattr(data, "read_corpus", lambda *args: pytest.fail("an unchanged corpus was read again"))
    assert data.prepare(str(src), data_dir=str(tmp_path / "data")) == second
    monkeypatch.undo()
    os.utime(src, ns=(1, 1))  # touched, not changed: read and hashed again, and found prepared
    monkeypatch.setattr(data, "write_prepared", lambda *args: pytest.fail("the same text was prepared again"))
    assert data.prepare(str(src), data_dir=str(tmp_path / "data")) == second
    assert not [p.name for p in (tmp_path / "data").rglob("*") if ".tmp" in p.name]


def test_an_edited_file_in_a_folder_corpus_is_prepared_anew(tmp_path):
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "a.txt").write_text("alpha\n" * 20)
    first = data.prepare(str(tmp_path / "books"), data_dir=str(tmp_path / "data"))
    (tmp_path / "books" / "b.txt").write_text("beta\n" * 20)
    assert data.prepare(str(tmp_path / "books"), data_dir=str(tmp_path / "data")) != first


def test_a_folder_with_a_symlink_loop_and_a_link_to_its_parent_prepares_its_files_once(tmp_path):
    root = tmp_path / "books"
    root.mkdir()
    (root / "a.txt").write_text("alpha\n" * 20)
    (root / "loop").symlink_to(root / "loop")
    (root / "up").symlink_to(root)
    folder = data.prepare(str(root), data_dir=str(tmp_path / "data"))
    assert data.load_meta(folder)["source"]["files"] == 1


def test_a_symlink_to_a_file_in_a_folder_corpus_is_refused_not_read(tmp_path):
    """A link to a file of the folder would read that file twice, one to a file elsewhere would read outside the
    folder: links in a dataset folder are not followed (docs/guarantees.md), and one to a file is named."""
    root = tmp_path / "books"
    root.mkdir()
    (root / "a.txt").write_text("alpha\n" * 20)
    (root / "b.txt").symlink_to(root / "a.txt")
    with pytest.raises(data.DataError, match=f"{root / 'b.txt'} is a symlink to {root / 'a.txt'}, and links in a "
                                             "dataset folder are not followed"):
        data.prepare(str(root), data_dir=str(tmp_path / "data"))
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("stop_at", ["encode", "val.bin"])
def test_ctrl_c_during_preparation_leaves_no_folder_and_no_temporary_file(tmp_path, monkeypatch, stop_at):
    src = tmp_path / "corpus.txt"
    src.write_text("some text to tokenize\n" * 50)
    real_open = builtins.open

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    if stop_at == "encode":
        monkeypatch.setattr(data, "encode", ctrl_c)
    else:
        monkeypatch.setattr(builtins, "open", lambda file, *a, **k: ctrl_c() if str(file).endswith(stop_at) else
                            real_open(file, *a, **k))
    with pytest.raises(KeyboardInterrupt):
        data.prepare(str(src), data_dir=str(tmp_path / "data"))
    monkeypatch.undo()
    assert [p.name for p in (tmp_path / "data").iterdir() if p.is_dir()] == []
    assert not [p.name for p in (tmp_path / "data").rglob("*") if ".tmp" in p.name]
    folder = data.prepare(str(src), data_dir=str(tmp_path / "data"))  # and the next run prepares it whole
    assert data.load_meta(folder)["train_tokens"] == len(src.read_bytes()) * 9 // 10


@pytest.mark.slow
def test_ctrl_c_in_data_py_is_one_line(tmp_path, gpt2_ranks):
    """A real SIGINT to python data.py while it tokenizes: no traceback, exit code 130, nothing prepared. The child
    gets SIGINT's default action back: a suite started in the background by a shell without job control ignores
    SIGINT, and its children would inherit that (Python then never raises KeyboardInterrupt)."""
    (tmp_path / "big.txt").write_bytes(b"a corpus that takes GPT-2's BPE some seconds to tokenize\n" * 400_000)
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "data.py"), "--dataset=big.txt", "--tokenizer=gpt2",
                                "--data_dir=data"], cwd=tmp_path, stderr=subprocess.PIPE, text=True,
                               preexec_fn=functools.partial(signal.signal, signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while not list(tmp_path.glob("data/*.lock")) and time.time() < deadline:  # taken just before tokenizing
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    err = process.communicate(timeout=120)[1]
    assert process.returncode == 130 and err == ("data.py: stopped by Ctrl-C; nothing was prepared (a prepared folder "
                                                 "is complete or absent)\n"), err
    assert [p.name for p in (tmp_path / "data").iterdir()] == [list(tmp_path.glob("data/*.lock"))[0].name]


# the child sends itself the signal once train.bin is in the temporary folder: mid-preparation, every time
SIGNAL_MID_WRITE = """
import os, signal, sys
sys.path.insert(0, os.getcwd())
fsync = os.fsync
def fsync_then_signal(fd):
    fsync(fd)
    os.kill(os.getpid(), signal.{signal})
os.fsync = fsync_then_signal
import {script}
sys.exit({script}.main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("script", ["data", "train"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_while_preparing_data_is_one_line_and_removes_the_tmp(tmp_path, script, sig):
    (tmp_path / "corpus.txt").write_text("a corpus that nothing has prepared yet\n" * 200)
    args = ["--dataset=" + str(tmp_path / "corpus.txt"), "--data_dir=" + str(tmp_path / "data")]
    if script == "train":
        args.append("--out_dir=" + str(tmp_path / "out"))
    done = subprocess.run([sys.executable, "-c", SIGNAL_MID_WRITE.format(signal=sig.name, script=script), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    stage = " before training began; prepared data is complete or absent" if script == "train" else \
        "; nothing was prepared (a prepared folder is complete or absent)"
    assert (done.returncode, done.stderr) == (128 + sig, f"{script}.py: stopped by {sig.name}{stage}\n")
    assert [p.name for p in (tmp_path / "data").iterdir() if not p.name.endswith(".lock")] == []
    assert not (tmp_path / "out").exists()


def test_a_dead_preparations_tmp_folder_is_removed_by_the_next_preparation_and_no_users_folder_is(tmp_path):
    """A leftover is nanonorm's by its name (<name>-<tokenizer>-<12 hex digits>.<pid>.tmp) and by the marker that
    write_prepared puts in it first: a user's folder that has only one of the two, or neither, is kept."""
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    data_dir = tmp_path / "data"
    leftovers = [data_dir / f"other-byte-0123456789ab.{dead}.tmp",  # another corpus, its process gone
                 data_dir / f"other-byte-0123456789ab.{os.getpid()}.tmp"]  # a live process: still preparing
    for tmp in leftovers:
        tmp.mkdir(parents=True)
        (tmp / data.MARKER).write_bytes(data.MARKER_TEXT)
        (tmp / "train.bin").write_bytes(b"\0" * 1000)
    users = {data_dir / f"notes.{dead}.tmp": None,  # the notes.2023.tmp, with a PID that is surely gone
             data_dir / f"drafts.{dead}.tmp": data.MARKER,  # a marker, but not a name nanonorm gives
             data_dir / f"mine-byte-0123456789ab.{dead}.tmp": None}  # nanonorm's name, but no marker
    for folder, marker in users.items():
        folder.mkdir()
        (folder / "draft.txt").write_text("x\n")
        if marker:
            (folder / marker).write_bytes(data.MARKER_TEXT)
    (tmp_path / "corpus.txt").write_text("a corpus to prepare beside the leftovers\n" * 50)
    data.prepare(str(tmp_path / "corpus.txt"), data_dir=str(data_dir))
    assert not leftovers[0].exists() and leftovers[1].exists()
    assert all((folder / "draft.txt").read_text() == "x\n" for folder in users)
    assert not (Path(data.prepare(str(tmp_path / "corpus.txt"), data_dir=str(data_dir))) / data.MARKER).exists()


def test_a_preparation_in_progress_is_never_taken_for_the_prepared_folder(tmp_path):
    """Another process's <folder>.<pid>.tmp holds a whole meta.json, with this corpus's stamp, for a moment before
    it renames the folder: a process that found it there would read files that are gone a moment later (two
    torchrun processes preparing at once did). prepare finds only the folder itself."""
    corpus, data_dir = tmp_path / "corpus.txt", tmp_path / "data"
    corpus.write_text("a corpus two processes prepare at once\n" * 50)
    folder = Path(data.prepare(str(corpus), data_dir=str(data_dir)))
    tmp = folder.parent / f"{folder.name}.{os.getppid()}.tmp"  # a live process's (pytest's parent): not a leftover
    folder.rename(tmp)  # the moment before os.replace(tmp, folder): a complete preparation, still under its tmp name
    (tmp / data.MARKER).write_bytes(data.MARKER_TEXT)
    assert data.prepared_with(data_dir, folder.name[:-12], data.stamp(data.corpus_files(str(corpus), data_dir,
                                                                                         None)[0])) is None
    assert data.prepare(str(corpus), data_dir=str(data_dir)) == str(folder)
    assert tmp.exists() and not (folder / data.MARKER).exists()


def test_shakespeare_downloads_once(tmp_path, monkeypatch):
    src = tmp_path / "tiny.txt"
    src.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 10)
    expected = src.read_text()
    opened = []
    urlopen = data.urllib.request.urlopen
    monkeypatch.setattr(data.urllib.request, "urlopen", lambda url, **kw: opened.append(url) or urlopen(url, **kw))
    data_dir = tmp_path / "data"
    folder = data.prepare("shakespeare", "byte", data_dir=str(data_dir), url=src.as_uri())
    assert Path(folder).parent == data_dir and Path(folder).name.startswith("shakespeare-byte-")
    assert (data_dir / "shakespeare" / "input.txt").read_text() == expected
    src.unlink()
    (Path(folder) / "meta.json").unlink()  # force a second preparation, which must reuse input.txt
    folder = data.prepare("shakespeare", "byte", data_dir=str(data_dir), url=src.as_uri())
    assert opened == [src.as_uri()]
    meta = data.load_meta(folder)
    assert meta["train_tokens"] + meta["val_tokens"] == len(expected.encode())


def test_the_shakespeare_cache_refuses_another_url(tmp_path):
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 10)
    second.write_text("Second Citizen:\nSpeak, speak.\n" * 10)
    data_dir = tmp_path / "data"
    data.prepare("shakespeare", data_dir=str(data_dir), url=first.as_uri())
    with pytest.raises(data.DataError) as e:
        data.prepare("shakespeare", data_dir=str(data_dir), url=second.as_uri())
    assert f"--url={second.as_uri()}: " in str(e.value) and f"downloaded from {first.as_uri()}" in str(e.value)
    (data_dir / "shakespeare" / "input.txt").unlink()
    folder = data.prepare("shakespeare", data_dir=str(data_dir), url=second.as_uri())
    assert data.load_meta(folder)["train_tokens"] + data.load_meta(folder)["val_tokens"] == len(second.read_bytes())


@pytest.mark.parametrize("served, says", [(b"", "sent nothing"), (b"  \n", "sent nothing"),
                                          (b"\x89PNG\r\n\x1a\n\x00\x00 binary", "not UTF-8 text"),
                                          ("caf\xe9\n".encode("latin-1") * 10, "not UTF-8 text")])
def test_an_empty_or_binary_download_is_refused_and_never_cached(tmp_path, served, says):
    bad, good = tmp_path / "bad.bin", tmp_path / "good.txt"
    bad.write_bytes(served)
    good.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 10)
    with pytest.raises(data.DataError) as e:
        data.prepare("shakespeare", data_dir=str(tmp_path / "data"), url=bad.as_uri())
    assert says in str(e.value) and bad.as_uri() in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "data" / "shakespeare" / "input.txt").exists()
    folder = data.prepare("shakespeare", data_dir=str(tmp_path / "data"), url=good.as_uri())  # not stuck on it
    assert data.load_meta(folder)["train_tokens"] > 0


def test_shakespeare_failed_download_says_where_to_put_the_file(tmp_path):
    with pytest.raises(data.DataError) as e:
        data.prepare("shakespeare", data_dir=str(tmp_path / "data"), url=(tmp_path / "missing.txt").as_uri())
    assert str(tmp_path / "data" / "shakespeare" / "input.txt") in str(e.value) and "\n" not in str(e.value)


def test_builtin_file_list():
    root, files = data.builtin_files()
    assert data.builtin_files() == (root, files)
    assert files == sorted(files) and len(set(files)) == len(files)
    assert "os.py" in files and "json/__init__.py" in files
    for f in files:
        parts = f.split("/")
        assert f.endswith(".py") and "site-packages" not in parts and "dist-packages" not in parts
        assert not any(p in ("test", "tests", "idle_test") or p.startswith("test_") for p in parts), f
    assert sum((root / f).stat().st_size for f in files) > 5_000_000


def test_prepare_builtin(tmp_path):
    root, files = data.builtin_files()
    corpus = "\n".join((root / f).read_bytes().decode("utf-8", "replace") for f in files).encode("utf-8")
    folder = data.prepare("builtin", "byte", data_dir=str(tmp_path))
    meta = data.load_meta(folder)
    assert Path(folder).parent == tmp_path and Path(folder).name.startswith("builtin-byte-")
    assert meta["train_tokens"] + meta["val_tokens"] == len(corpus)
    assert meta["train_tokens"] == len(corpus) * 9 // 10
    assert meta["source"]["files"] == len(files) and meta["source"]["path"] == str(root)
    val = np.fromfile(Path(folder) / "val.bin", dtype=np.uint16)
    assert bytes(val.astype(np.uint8)) == corpus[meta["train_tokens"]:]
    assert 0 < meta["unigram_entropy"] < math.log(256)


def test_empty_and_missing_corpus(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "nothing").mkdir()
    for path in (tmp_path / "empty.txt", tmp_path / "nothing"):
        with pytest.raises(data.DataError, match="holds no text"):
            data.prepare(str(path), data_dir=str(tmp_path / "data"))
    with pytest.raises(data.DataError, match="no such file"):
        data.prepare(str(tmp_path / "absent.txt"), data_dir=str(tmp_path / "data"))


@pytest.fixture
def letters(tmp_path):
    rng = random.Random(1)
    text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(5000))
    src = tmp_path / "letters.txt"
    src.write_text(text)
    return data.prepare(str(src), "byte", data_dir=str(tmp_path / "data")), text.encode()


def test_get_batch_windows_and_shift(letters):
    folder, corpus = letters
    g = torch.Generator().manual_seed(0)
    B, T = 5, 17
    x, y = data.get_batch(folder, "train", B, T, g, "cpu")
    assert x.shape == y.shape == (B, T) and x.dtype == y.dtype == torch.int64
    assert torch.equal(y[:, :-1], x[:, 1:])
    train = corpus[:len(corpus) * 9 // 10]
    for row in range(B):
        assert bytes(x[row].tolist()) + bytes([y[row, -1].item()]) in train  # a real window of T + 1 tokens
    xv, yv = data.get_batch(folder, "val", B, T, g, torch.device("cpu"))
    for row in range(B):
        assert bytes(xv[row].tolist()) + bytes([yv[row, -1].item()]) in corpus[len(train):]


def test_get_batch_is_reproducible_from_generator_state(letters):
    folder, _ = letters
    g = torch.Generator().manual_seed(1234)
    state = g.get_state()
    x1, y1 = data.get_batch(folder, "train", 8, 16, g, "cpu")
    x2, y2 = data.get_batch(folder, "train", 8, 16, g, "cpu")
    assert not torch.equal(x1, x2)  # the generator advanced
    g.set_state(state)
    x3, y3 = data.get_batch(folder, "train", 8, 16, g, "cpu")
    assert torch.equal(x1, x3) and torch.equal(y1, y3)


def test_check_length():
    meta = dict(train_tokens=900, val_tokens=100)
    data.check_length(meta, 99)
    with pytest.raises(data.DataError) as e:
        data.check_length(meta, 100)
    assert "val" in str(e.value) and "100 tokens" in str(e.value) and "block_size=100" in str(e.value)
    with pytest.raises(data.DataError, match="train split has 900 tokens"):
        data.check_length(meta, 1000)


def run_cli(tmp_path, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "data.py"), *args, f"--data_dir={tmp_path / 'data'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)


def test_cli_prepares_and_summarizes(tmp_path):
    (tmp_path / "corpus.txt").write_text("to be or not to be\n" * 50)
    r = run_cli(tmp_path, "--dataset", "corpus.txt", "--tokenizer", "byte")
    assert r.returncode == 0, r.stderr
    assert "855 train and 95 val tokens" in r.stdout and "nats/token" in r.stdout
    assert len(list((tmp_path / "data").glob("corpus.txt-*/meta.json"))) == 1


def test_cli_help_lists_the_flags_with_prepares_defaults(capsys):
    assert data.main(["--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name, param in inspect.signature(data.prepare).parameters.items():
        assert any(line.split()[:2] == [f"--{name}", str(param.default)] for line in lines), (name, lines)


def test_eval_starts_are_evenly_spaced_over_the_split():
    # 100 tokens, windows of 9 + 1: the last start is 90; 5 windows at 0, 90/4, 2 x 90/4, 3 x 90/4, 90, rounded down
    assert data.eval_starts(100, 9, 5) == [0, 22, 45, 67, 90]
    assert data.eval_starts(100, 9, 1) == [0]
    assert data.eval_starts(10, 9, 3) == [0, 0, 0]  # a split of exactly one window: every window is that one
    with pytest.raises(ValueError, match="no window"):
        data.eval_starts(9, 9, 2)


@pytest.mark.parametrize("count, batch_size", [(12, 4), (13, 4), (7, 3), (1, 4), (40, 16)])
def test_eval_batches_share_the_same_windows_among_any_number_of_processes(count, batch_size):
    starts = data.eval_starts(10_000, 32, count)
    one = data.eval_batches(starts, batch_size, 0, 1)
    assert one == [starts[b:b + batch_size] for b in range(0, count, batch_size)]
    for world_size in (2, 3):
        shares = [data.eval_batches(starts, batch_size, rank, world_size) for rank in range(world_size)]
        assert len({len(share) for share in shares}) == 1  # as many batches on every process
        assert all(len(batch) <= batch_size for share in shares for batch in share)
        together = sorted(i for share in shares for batch in share for i in batch)
        assert together == sorted(starts)  # every window exactly once


def test_windows_are_the_tokens_at_the_starts(letters):
    folder, corpus = letters
    train = corpus[:len(corpus) * 9 // 10]
    x, y = data.windows(folder, "train", [0, 7, len(train) - 11], 10, "cpu")
    for row, start in enumerate([0, 7, len(train) - 11]):
        assert bytes(x[row].tolist()) == train[start:start + 10]
        assert bytes(y[row].tolist()) == train[start + 1:start + 11]


def test_the_vocabulary_sizes_load_meta_checks_are_the_tokenizers(gpt2_ranks):
    assert {name: data.get_tokenizer(name).n_vocab for name in data.TOKENIZERS} == data.VOCAB_SIZES


# Bad input to data.py, each run as a real process: exit code 2, one line on stderr, no traceback, and every file under
# the working folder (data_dir included) exactly as it was.

@pytest.fixture
def corpora(tmp_path):
    (tmp_path / "corpus.txt").write_text("some text, enough for a split\n" * 10)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "latin1.txt").write_bytes("café au lait\n".encode("latin-1"))
    (tmp_path / "blob.txt").write_bytes(b"valid UTF-8 with a NUL\x00 byte\n")
    (tmp_path / "a_file").write_text("not a folder\n")
    (tmp_path / "no_text").mkdir()
    (tmp_path / "no_text" / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (tmp_path / "nothing").mkdir()
    return tmp_path


@pytest.mark.parametrize("args, says", [
    (["--dataset="], "--dataset is empty"),
    (["--dataset=absent.txt"], "no such file"),
    (["--dataset=empty.txt"], "holds no text"),
    (["--dataset=latin1.txt"], "not UTF-8 text"),
    (["--dataset=blob.txt"], "not UTF-8 text"),
    (["--dataset=nothing"], "holds no text"),
    (["--dataset=no_text"], "holds no text"),
    (["--dataset=corpus.txt", "--tokenizer=bpe"], "--tokenizer=bpe is not allowed; choose one of byte, gpt2"),
    (["--dataset=corpus.txt", "--tokenizer="], "--tokenizer= is not allowed; choose one of byte, gpt2"),
    (["--dataset=corpus.txt", "--bogus=1"], "unknown flag --bogus"),
    (["corpus.txt"], "unexpected argument 'corpus.txt'"),
    (["--dataset"], "--dataset needs a value"),
    (["--dataset=corpus.txt", "--url=file:///x"], "--url only applies"),
    (["--dataset=shakespeare", "--url=file:///no/such/input.txt"], "could not download"),
    (["--dataset=shakespeare", "--url="], "--url is empty"),
    (["--dataset=corpus.txt", "--data_dir=a_file/data"], "a_file/data"),
    (["--dataset=corpus.txt", "--data_dir=a_file"], "--data_dir=a_file"),
])
def test_data_bad_input(corpora, args, says):
    if not any(arg.startswith("--data_dir") for arg in args):
        args = [*args, "--data_dir=data"]
    assert says in refused(corpora, "data.py", args)


def test_a_url_to_no_text_file_or_to_too_much_is_refused_and_leaves_nothing(tmp_path):
    fifo = tmp_path / "input.fifo"
    os.mkfifo(fifo)
    with pytest.raises(data.DataError, match="is not a regular file"):  # opening it would wait forever
        data.download(fifo.as_uri(), tmp_path / "input.txt")
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as f:
        f.truncate(data.MAX_DOWNLOAD + 1)  # sparse: no disk, but as many bytes to read as a real file
    with pytest.raises(data.DataError, match="sent more than 64 MB"):
        data.download(huge.as_uri(), tmp_path / "input.txt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.txt", "input.fifo"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder")
def test_data_dir_not_writable(corpora):
    (corpora / "locked").mkdir(mode=0o555)
    assert "--data_dir=locked/data" in refused(corpora, "data.py", ["--dataset=corpus.txt", "--data_dir=locked/data"])


def damage_meta(edit):
    def damage(folder):
        meta = json.loads((folder / "meta.json").read_text())
        edit(meta)
        (folder / "meta.json").write_text(json.dumps(meta))
    return damage


def truncate(name, n_bytes):
    def damage(folder):
        path = folder / name
        path.write_bytes(path.read_bytes()[:n_bytes])
    return damage


def set_token(path, index, value):
    tokens = np.fromfile(path, dtype=np.uint16)
    tokens[index] = value
    tokens.tofile(path)


@pytest.mark.slow
@pytest.mark.parametrize("damage, says", [
    (truncate("train.bin", -2), "train.bin has"),
    (truncate("train.bin", -1), "train.bin has"),  # half a token
    (truncate("train.bin", 0), "train.bin has 0 bytes"),
    (lambda folder: (folder / "val.bin").unlink(), "val.bin is missing"),
    (lambda folder: (folder / "meta.json").write_bytes(b"\x00{garbage"), "meta.json is not JSON"),
    (lambda folder: (folder / "meta.json").write_text("[" * 100_000), "meta.json is not JSON"),  # RecursionError
    (lambda folder: (folder / "meta.json").write_text("[]"), "meta.json's tokenizer"),
    (damage_meta(lambda meta: meta.pop("dtype")), "meta.json's dtype is None"),
    (damage_meta(lambda meta: meta.update(train_tokens=str(meta["train_tokens"]))), "meta.json's train_tokens"),
    (damage_meta(lambda meta: meta.update(val_tokens=True)), "meta.json's val_tokens"),
    (damage_meta(lambda meta: meta.update(train_tokens=meta["train_tokens"] + 1)), "train.bin has"),
    (damage_meta(lambda meta: meta.update(val_tokens=meta["val_tokens"] - 1)), "val.bin has"),
    (damage_meta(lambda meta: meta.update(dtype="uint32")), "stored as uint16"),
    (damage_meta(lambda meta: meta.update(dtype="float16")), "stored as uint16"),
    (damage_meta(lambda meta: meta.update(vocab_size=300)), "vocab_size is 300, but the byte tokenizer's is 256"),
    (damage_meta(lambda meta: meta.update(tokenizer="bpe")), "meta.json's tokenizer is 'bpe', not one of byte, gpt2"),
    (lambda folder: set_token(folder / "train.bin", 5, 256), "train.bin holds token id 256, but the vocabulary has"),
    (lambda folder: set_token(folder / "val.bin", 0, 65535), "val.bin holds token id 65535"),
])
def test_damaged_prepared_dataset(corpora, damage, says):
    folder = Path(data.prepare(str(corpora / "corpus.txt"), "byte", str(corpora / "data")))
    damage(folder)
    err = refused(corpora, "data.py", ["--dataset=corpus.txt", "--data_dir=data"])
    assert says in err and "damaged" in err and str(folder.relative_to(corpora)) in err, err
