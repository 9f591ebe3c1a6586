"""Corpora of the datasets library (--dataset=hf:..., data.prepare_streamed and engine/corpus.py): local parquet and
JSON-lines files the tests write, read through datasets, tokenized by worker processes, the same bytes for any number
of workers, resumed after an interruption; a Hub name that is neither reachable nor cached is one line."""
import hashlib
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

import configs
import data
from conftest import ROOT
from engine import corpus

pytest.importorskip("datasets")  # requirements.txt installs it; without it, this file has nothing to test

WORDS = "the of and to in a is that for it as was with be by on not he this are or his from at which".split()


def documents(count, seed=0):
    """count documents of random words, of very different lengths, one with non-ASCII text."""
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60))) + f" ({i})" for i in range(count)]
    texts[3] = "Héllo, wörld — 日本語 🙂\n\tdef f(x):\r\n    return x"
    return texts


def write_parquet(folder, texts, parts=2):
    """texts as `parts` parquet files of small row groups in folder (the order: file by file, row by row)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    folder.mkdir(parents=True, exist_ok=True)
    size = -(-len(texts) // parts)
    for part in range(parts):
        rows = [{"id": i, "text": t} for i, t in enumerate(texts[part * size:(part + 1) * size], part * size)]
        pq.write_table(pa.Table.from_pylist(rows), folder / f"part-{part}.parquet", row_group_size=7)
    return folder


def write_jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t, "url": f"u{i}"}) + "\n" for i, t in enumerate(texts)))
    return path


def by_hand(texts, split):
    """The byte tokenizer's train.bin or val.bin of these documents, written out: each document's UTF-8 bytes after
    a newline, as uint16 ids, document i in val when i % 100 == 0."""
    keep = (lambda i: i % 100 == 0) if split == "val" else (lambda i: i % 100 != 0)
    text = b"".join(b"\n" + t.encode("utf-8") for i, t in enumerate(texts) if keep(i))
    return np.frombuffer(text, dtype=np.uint8).astype(np.uint16).tobytes()


def read(folder, split):
    return (folder / f"{split}.bin").read_bytes()


@pytest.fixture(scope="module")
def texts():
    return documents(230)


def test_parquet_and_json_lines_prepare_the_documents_in_order_with_val_every_hundredth(tmp_path, texts):
    parquet = data.prepare("hf:" + str(write_parquet(tmp_path / "pq", texts)), "byte", tmp_path / "data", workers=1)
    jsonl = data.prepare("hf:" + str(write_jsonl(tmp_path / "c.jsonl", texts)), "byte", tmp_path / "data", workers=1)
    assert parquet != jsonl
    for folder in map(type(tmp_path), (parquet, jsonl)):
        assert read(folder, "train") == by_hand(texts, "train")
        assert read(folder, "val") == by_hand(texts, "val")  # documents 0, 100 and 200
        meta = data.load_meta(folder)
        source = meta["source"]
        assert (source["documents"], source["val_documents"], source["train_documents"]) == (230, 3, 227)
        assert (meta["train_tokens"], meta["val_tokens"]) == (len(by_hand(texts, "train")) // 2,
                                                              len(by_hand(texts, "val")) // 2)
        assert source["sha256"] == hashlib.sha256(read(folder, "train") + read(folder, "val")).hexdigest()
        assert (source["split"], source["config"], source["revision"]) == ("train", None, None)
        assert "i % 100 == 0" in source["val_split"]
        assert not os.path.exists(f"{folder}.partial")


def test_one_and_two_workers_write_the_same_bytes(tmp_path, texts, monkeypatch):
    monkeypatch.setattr(corpus, "CHUNK_DOCS", 16)  # 15 chunks: two workers take them in turn
    dataset = "hf:" + str(write_parquet(tmp_path / "pq", texts, parts=3))
    one = type(tmp_path)(data.prepare(dataset, "byte", tmp_path / "one", workers=1))
    two = type(tmp_path)(data.prepare(dataset, "byte", tmp_path / "two", workers=2))
    assert read(one, "train") == read(two, "train") == by_hand(texts, "train")
    assert read(one, "val") == read(two, "val")
    assert (one / "meta.json").read_bytes() == (two / "meta.json").read_bytes()


def test_gpt2_documents_start_with_endoftext(tmp_path, gpt2_ranks):
    texts = ["hello world", "<|endoftext|> is plain text here", "a third"]
    folder = data.prepare("hf:" + str(write_jsonl(tmp_path / "c.jsonl", texts)), "gpt2", tmp_path / "data", workers=1)
    enc = data.get_tokenizer("gpt2")
    train = np.fromfile(os.path.join(folder, "train.bin"), dtype=np.uint16).tolist()
    assert train == [50256, *enc.encode_ordinary(texts[1]), 50256, *enc.encode_ordinary(texts[2])]
    assert np.fromfile(os.path.join(folder, "val.bin"), dtype=np.uint16).tolist() == [50256, 31373, 995]


COMMIT = corpus.commit


class Stop(KeyboardInterrupt):
    """The interruption the test makes (a Ctrl-C, a kill) after some chunks are on the disk."""


def commits_counted(monkeypatch, stop_after=None):
    """corpus.commit, counting its calls (a list, one entry per chunk written), raising Stop before the call
    stop_after + 1 where stop_after is given."""
    calls = []

    def counted(partial, outputs, chunk, done, bar):
        if stop_after is not None and len(calls) == stop_after:
            raise Stop()
        calls.append(chunk[0])
        return COMMIT(partial, outputs, chunk, done, bar)

    monkeypatch.setattr(corpus, "commit", counted)
    return calls


def test_an_interrupted_preparation_resumes_after_its_last_chunk_and_writes_the_same_bytes(tmp_path, texts,
                                                                                           monkeypatch):
    monkeypatch.setattr(corpus, "CHUNK_DOCS", 16)  # 230 documents: 15 chunks
    dataset = "hf:" + str(write_jsonl(tmp_path / "c.jsonl", texts))
    whole = type(tmp_path)(data.prepare(dataset, "byte", tmp_path / "whole", workers=2))
    commits_counted(monkeypatch, stop_after=5)
    with pytest.raises(Stop):
        data.prepare(dataset, "byte", tmp_path / "data", workers=2)
    partial = next((tmp_path / "data").glob("*.partial"))
    assert not any(p.is_dir() and p.suffix != ".partial" for p in (tmp_path / "data").iterdir())  # no folder yet
    progress = json.loads((partial / corpus.PROGRESS).read_text())
    assert progress["documents"] == 5 * 16
    with open(partial / "train.bin", "ab") as f:  # a chunk written after the last record: cut back on resume
        f.write(b"not recorded")
    written = commits_counted(monkeypatch)
    folder = type(tmp_path)(data.prepare(dataset, "byte", tmp_path / "data", workers=1))
    assert written == list(range(80, 230, 16))  # the ten chunks left, each once
    assert read(folder, "train") == read(whole, "train") and read(folder, "val") == read(whole, "val")
    assert json.loads((folder / "meta.json").read_text())["source"]["sha256"] == \
        json.loads((whole / "meta.json").read_text())["source"]["sha256"]
    assert not partial.exists()


def test_a_prepared_corpus_is_found_without_opening_it_and_an_edited_one_is_prepared_anew(tmp_path, texts,
                                                                                         monkeypatch):
    path = write_jsonl(tmp_path / "c.jsonl", texts)
    first = data.prepare(f"hf:{path}", "byte", tmp_path / "data", workers=1)
    assert data.prepared_streamed(f"hf:{path}", "byte", tmp_path / "data") == type(tmp_path)(first)
    opened = corpus.open_stream
    monkeypatch.setattr(corpus, "open_stream", lambda *args: pytest.fail("a prepared corpus was opened again"))
    assert data.prepare(f"hf:{path}", "byte", tmp_path / "data", workers=1) == first
    write_jsonl(path, texts[:150])
    os.utime(path, ns=(1, 1))  # another size and time: another stamp
    monkeypatch.setattr(corpus, "open_stream", opened)
    assert data.prepared_streamed(f"hf:{path}", "byte", tmp_path / "data") is None
    second = data.prepare(f"hf:{path}", "byte", tmp_path / "data", workers=1)
    assert second != first and data.load_meta(second)["source"]["documents"] == 150


def test_the_hub_names_folder_is_keyed_on_name_config_and_split_and_a_run_records_it_as_given():
    folder, identity, files = data.streamed_identity(data.FINEWEB_EDU, "gpt2")
    assert files is None and identity["name"] == "HuggingFaceFW/fineweb-edu"
    assert (identity["config"], identity["split"]) == ("sample-10BT", "train")
    assert folder.startswith("hf-HuggingFaceFW--fineweb-edu-sample-10BT-train-gpt2-")
    assert data.streamed_identity("hf:HuggingFaceFW/fineweb-edu:sample-100BT", "gpt2")[0] != folder
    assert configs.dataset_path(data.FINEWEB_EDU) == data.FINEWEB_EDU


def test_a_run_records_a_local_corpus_by_its_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "c.jsonl").write_text('{"text": "x"}\n')
    monkeypatch.chdir(tmp_path)
    assert configs.dataset_path("hf:c.jsonl") == f"hf:{tmp_path}/c.jsonl"
    assert configs.dataset_path("hf:c.jsonl::validation") == f"hf:{tmp_path}/c.jsonl::validation"


@pytest.mark.parametrize("spec, says", [
    ("hf:", "is not a corpus of the datasets library"),
    ("hf:a:b:c:d", "is not a corpus of the datasets library"),
    ("hf:no such/corpus here", "neither a file or folder here nor a Hub name"),
])
def test_a_bad_spec_is_one_line_and_writes_nothing(tmp_path, spec, says):
    with pytest.raises(data.DataError, match=says):
        data.prepare(spec, "byte", tmp_path / "data")
    assert not (tmp_path / "data").exists()


def test_documents_without_a_text_column_are_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"content": "x", "id": 1}\n')
    with pytest.raises(data.DataError, match="no text column 'text'.*columns: content, id"):
        data.prepare(f"hf:{path}", "byte", tmp_path / "data")
    assert not (tmp_path / "data").exists()


def test_files_of_two_kinds_are_refused(tmp_path, texts):
    folder = write_parquet(tmp_path / "mixed", texts)
    write_jsonl(folder / "more.jsonl", texts)
    with pytest.raises(data.DataError, match="files of one kind"):
        data.prepare(f"hf:{folder}", "byte", tmp_path / "data")


def test_offline_a_hub_name_not_in_the_cache_is_one_line_exit_2_saying_how_to_bring_it(tmp_path):
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    result = subprocess.run([sys.executable, "data.py", "--dataset=hf:nanonorm-tests/not-a-corpus:c:train",
                             f"--data_dir={tmp_path / 'data'}"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    line = result.stderr
    assert line.startswith("data.py: datasets could not open nanonorm-tests/not-a-corpus")
    assert "machine with network" in line and "copy the prepared folder" in line and "HF_DATASETS_OFFLINE=1" in line
    assert not (tmp_path / "data").exists()


def test_data_py_prepares_a_corpus_of_the_datasets_library_and_says_what_it_read(tmp_path, texts):
    path = write_jsonl(tmp_path / "c.jsonl", texts)
    result = subprocess.run([sys.executable, "data.py", f"--dataset=hf:{path}", f"--data_dir={tmp_path / 'data'}",
                             "--workers=2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "230 documents read (3 in val)" in result.stdout
    assert "230/230" in result.stderr  # the progress bar, against the lines counted
    bad = subprocess.run([sys.executable, "data.py", f"--dataset=hf:{path}", "--workers=0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip() == "data.py: --workers=0 must be from 1 to 1024"


def test_a_preparation_whose_progress_bar_loses_its_reader_stops_as_for_sighup(tmp_path, texts):
    """Issue 55: with its stderr's reader gone (`python data.py ... 2>&1 | head -1` once head has its line), data.py
    died of SIGPIPE at its progress bar, exit code 141, its temporary folder left. Now it stops as for SIGHUP: exit
    code 129, no folder but the resumable .partial one in --data_dir, and the same command then prepares it."""
    path = write_jsonl(tmp_path / "c.jsonl", texts)
    argv = [sys.executable, "data.py", f"--dataset=hf:{path}", f"--data_dir={tmp_path / 'data'}", "--workers=1"]
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=write_end, text=True, timeout=300)
    finally:
        os.close(write_end)
    assert (result.returncode, result.stdout) == (129, "")
    assert all(p.suffix == ".partial" for p in (tmp_path / "data").iterdir() if p.is_dir())  # and its .lock
    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "230 documents read" in again.stdout, again.stderr
