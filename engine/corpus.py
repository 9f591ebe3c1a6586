"""
Corpora of the `datasets` library, streamed into a prepared folder that train.py reads as it reads data.py's others:
train.bin and val.bin (token ids, uint16 for GPT-2's BPE) and meta.json. data.prepare calls it for
--dataset=hf:NAME[:CONFIG[:SPLIT]]: a Hub name (FineWeb-Edu's sample-10BT, OpenWebText) or a local file or folder of
parquet, JSON lines or text, all read through datasets. `open_stream` opens one, `write_streamed` prepares it.

As nanoGPT's prepare.py (OpenWebText) and llm.c's fineweb.py, worker processes tokenize the documents with tiktoken,
and each document starts with a delimiter (GPT-2's <|endoftext|>; a newline for byte tokens). Unlike theirs, nothing
is held whole: the stream is read CHUNK_DOCS documents at a time, at most two chunks per worker are in flight, and each
is appended to the files as it comes back, so the memory does not grow with the corpus. A chunk is tokenized whole by
one worker and written in the stream's order, so any number of workers writes the same bytes.

The split is fixed by a document's place in the stream: document i goes to val.bin when i % VAL_EVERY == 0 (1%),
whatever the corpus's size or the number of workers (nanoGPT holds out 0.05% of OpenWebText at random, llm.c the
first shard of FineWeb). meta.json records the rule, the counts of documents and tokens, the revision the Hub served
and the sha256 of train.bin then val.bin.

The preparation writes into <folder>.partial and, once each chunk is on the disk, records how far it got there
(progress.json: the documents and tokens written and datasets' state_dict of the stream), so a preparation stopped by
Ctrl-C, a kill or a lost node resumes where it was; the finished folder is renamed into place whole. The caller holds
the folder's lock meanwhile (data.prepare). Imports nothing of nanonorm but engine/; datasets, pyarrow and tqdm are
imported only here, where they are used.
"""

import collections
import contextlib
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from engine.files import cannot_write, open_own, read_json, write_and_sync, write_atomic

BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".txt": "text"}  # datasets' packaged builders
TEXT_COLUMN = "text"  # FineWeb-Edu's and OpenWebText's column, and the text builder's
CHUNK_DOCS = 1024  # documents a worker tokenizes at once (FineWeb-Edu's average document: about 1,000 GPT-2 tokens)
VAL_EVERY = 100  # document i is in val.bin when i % VAL_EVERY == 0
PROGRESS = "progress.json"
BLOCK = 2 ** 24  # tokens read at a time for the sha256 and the unigram counts


class CorpusError(Exception):
    """A corpus that cannot be read as asked; the message is one line saying what and how to fix it."""


@dataclass
class Stream:
    """A corpus opened for reading: its documents (a datasets.IterableDataset), where they come from (name, config,
    split, revision) and how many documents there are where that is known (None: the progress shows no ETA)."""
    documents: object
    source: dict
    expected: Optional[int]


def builder_of(files):
    """The datasets builder that reads these local files (parquet, json, text), one kind for all."""
    kinds = {BUILDERS.get(suffix(path)) for path in files}
    if None in kinds or len(kinds) != 1:
        raise CorpusError(f"{files[0].parent}: a corpus read through datasets is files of one kind, "
                          f"{', '.join(sorted(BUILDERS))}; found {', '.join(sorted({suffix(p) for p in files}))}")
    return kinds.pop()


def suffix(path):
    return Path(path).suffix.lower()


def open_stream(name, config, split, files):
    """The corpus as a stream: local files (in order) through the builder their kind names, or, where files is None,
    the Hub's dataset name with its config and split. Offline (HF_DATASETS_OFFLINE=1 or HF_HUB_OFFLINE=1) a Hub
    corpus is read from datasets' cache (memory-mapped Arrow files) instead of streamed; one in neither place is a
    CorpusError saying how to bring it here."""
    import datasets  # here: only a corpus of the datasets library needs it
    datasets.disable_progress_bars()  # the preparation's own bar is the one a person reads
    kind = builder_of(files) if files else None
    try:
        if files:
            builder = datasets.load_dataset_builder(kind, data_files=[str(f) for f in files])
        else:
            builder = datasets.load_dataset_builder(name, config)
        if files or not datasets.config.HF_HUB_OFFLINE:
            documents = builder.as_streaming_dataset(split=split)
        else:
            builder.download_and_prepare()
            documents = builder.as_dataset(split=split).to_iterable_dataset()
        first = next(iter(documents), None)  # read now: a corpus without text writes nothing
    except Exception as e:  # datasets raises many kinds: ConnectionError, FileNotFoundError, ValueError, ArrowInvalid
        raise CorpusError(cannot_open(name, config, split, files, e)) from None
    if first is None:
        raise CorpusError(f"{name} (split {split}) holds no documents")
    text_of(first)
    # the Hub resolves its files at a commit, which their paths name (hf://datasets/NAME@SHA/...)
    revision = re.search(r"@([0-9a-f]{40})", str(builder.config.data_files))
    source = dict(name=name, config=config, split=split, revision=revision[1] if revision else None)
    return Stream(documents, source, expected_documents(builder, split, files))


def cannot_open(name, config, split, files, error):
    """The one line of a corpus datasets could not open: for a Hub name, how to prepare it without network here."""
    why = f"{type(error).__name__}: {one_line(error)}"
    if files:
        return f"datasets could not read {name} ({why}); give parquet, JSON-lines or text files"
    spec = ":".join(part for part in (name, config or "", split) if part is not None)
    return (f"datasets could not open {name} (config {config}, split {split}) from the Hub or its cache ({why}); "
            f"without network here, prepare it on a machine with network (python data.py --dataset=hf:{spec} "
            "--tokenizer=...) and copy the prepared folder into --data_dir, or download it there into datasets' "
            "cache, copy the cache here and set HF_DATASETS_OFFLINE=1")


def expected_documents(builder, split, files):
    """How many documents the stream holds, where it is cheap to know: the rows of local parquet files (their
    footers), the lines of JSON-lines or text files (one document a line), or the Hub's split size; else None."""
    if files and builder_of(files) == "parquet":
        import pyarrow.parquet as pq  # datasets' own dependency
        return sum(pq.ParquetFile(path).metadata.num_rows for path in files)
    if files and all(suffix(path) in (".jsonl", ".txt") for path in files):
        return sum(count_lines(path) for path in files)
    splits = builder.info.splits
    return splits[split].num_examples if splits and split in splits and splits[split].num_examples else None


def count_lines(path):
    """The lines of a file, a last one without its newline included, read a block at a time."""
    lines, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


def text_of(record):
    """A document's text: its TEXT_COLUMN, which must be a string."""
    text = record.get(TEXT_COLUMN) if isinstance(record, dict) else None
    if not isinstance(text, str):
        columns = ", ".join(record) if isinstance(record, dict) else type(record).__name__
        raise CorpusError(f"a document has no text column {TEXT_COLUMN!r} holding a string (its columns: {columns}); "
                          f"a corpus read through datasets keeps each document's text in {TEXT_COLUMN!r}")
    return text


def chunks(documents, first, name):
    """(index of its first document, its texts, the stream's state after its last one) for each CHUNK_DOCS
    documents of the stream, the last chunk shorter; first: the index of the stream's first document here (a
    resumed stream starts past the documents written). An error of datasets while reading is a CorpusError."""
    texts, iterator = [], iter(documents)
    while True:
        try:
            record = next(iterator)
        except StopIteration:
            break
        except Exception as e:  # a damaged file, a lost connection: whatever datasets and pyarrow raise
            raise CorpusError(f"datasets could not read {name} ({type(e).__name__}: {one_line(e)}); the "
                              "preparation resumes from its last chunk when run again") from None
        texts.append(text_of(record))
        if len(texts) == CHUNK_DOCS:
            yield first, texts, json.dumps(documents.state_dict())
            first, texts = first + len(texts), []
    if texts:
        yield first, texts, json.dumps(documents.state_dict())


def one_line(error):
    """The first line of an error's message, at most 200 characters."""
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else ""


def ignore_interrupts():
    """A worker's start: a Ctrl-C in the terminal reaches the whole process group, and only the main process
    should act on it (it stops the workers)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_over(partial, identity):
    """An empty <folder>.partial for this corpus, with its progress at nothing."""
    if partial.is_symlink() or partial.exists():
        remove(partial)
    partial.mkdir(parents=True)
    done = dict(identity=identity, documents=0, train_tokens=0, val_tokens=0, state=None)
    for name in ("train.bin", "val.bin"):
        write_and_sync(partial / name, b"")
    write_atomic(partial / PROGRESS, json.dumps(done).encode())
    return done


def remove(path):
    """A file, a link or a folder at path, gone."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def resume_point(partial, identity, itemsize):
    """What a stopped preparation of this corpus had written (its progress.json), with train.bin and val.bin cut back
    to it: a chunk appended after the last record is written again. A fresh start where there is none, or where it
    is another corpus's or damaged."""
    try:
        done = read_json(partial / PROGRESS)
        sizes = {split: done[f"{split}_tokens"] * itemsize for split in ("train", "val")}
        fits = done["identity"] == identity and all(
            (partial / f"{split}.bin").stat().st_size >= size for split, size in sizes.items())
    except (OSError, ValueError, KeyError, TypeError):  # none, or damaged: files.NotAFile is a ValueError's sibling
        fits = False
    if not fits:
        return start_over(partial, identity)
    for split, size in sizes.items():
        os.truncate(partial / f"{split}.bin", size)
    return done


def commit(partial, outputs, chunk, done, bar):
    """A tokenized chunk appended to train.bin and val.bin, flushed to the disk, then recorded in progress.json with
    the stream's state after it: a preparation stopped at any point resumes after the last chunk recorded."""
    first, count, state, result = chunk
    ids = dict(zip(("train", "val"), result.get()))
    try:
        for split, out in outputs.items():
            out.write(ids[split].tobytes())
            out.flush()
            os.fsync(out.fileno())
            done[f"{split}_tokens"] += len(ids[split])
    except OSError as e:
        raise cannot_write(out.name, e) from None
    done.update(documents=first + count, state=state)
    write_atomic(partial / PROGRESS, json.dumps(done).encode())
    bar.update(count)
    bar.set_postfix_str(f"{done['train_tokens'] + done['val_tokens']:,} tokens", refresh=False)


def progress_bar(stream, done, name):
    """tqdm's bar on stderr: documents against the expected count (its ETA), and tokens written."""
    from tqdm import tqdm  # datasets' own dependency
    return tqdm(total=stream.expected, initial=done["documents"], unit=" docs", unit_scale=True, desc=name,
                file=sys.stderr, mininterval=1.0)


def write_streamed(folder, stream, encode, workers, head, dtype):
    """stream's documents tokenized into folder: train.bin, val.bin and meta.json (head, with the counts, the
    sha256 and the unigram entropy of val added). encode(texts, first): the (train ids, val ids) of a chunk, as
    arrays of dtype, run by `workers` processes (a picklable function of a module). Resumes a stopped preparation of
    the same corpus (head["source"]["identity"]); the folder appears whole, or not at all."""
    partial = Path(f"{folder}.partial")
    done = resume_point(partial, head["source"]["identity"], np.dtype(dtype).itemsize)
    if done["state"]:
        stream.documents.load_state_dict(json.loads(done["state"]))
    bar = progress_bar(stream, done, folder.name)
    # spawn, not fork: the stream's reader threads (pyarrow, fsspec) must not be copied mid-work into the workers
    with multiprocessing.get_context("spawn").Pool(workers, initializer=ignore_interrupts) as pool, \
            contextlib.ExitStack() as stack:
        outputs = {split: stack.enter_context(open(partial / f"{split}.bin", "ab", opener=open_own))
                   for split in ("train", "val")}
        pending = collections.deque()
        for first, texts, state in chunks(stream.documents, done["documents"], head["source"]["dataset"]):
            pending.append((first, len(texts), state, pool.apply_async(encode, (texts, first))))
            if len(pending) >= 2 * workers:  # the bound on memory: what is read waits for what is written
                commit(partial, outputs, pending.popleft(), done, bar)
        while pending:
            commit(partial, outputs, pending.popleft(), done, bar)
    bar.close()
    finish(partial, folder, head, done, dtype)


def finish(partial, folder, head, done, dtype):
    """meta.json into the partial folder, which is then renamed to folder: the prepared folder appears whole."""
    if not done["val_tokens"] or not done["train_tokens"]:
        raise CorpusError(f"{head['source']['dataset']} holds {done['documents']} documents; a prepared corpus needs "
                          f"at least 2 (document i is in the validation split when i % {VAL_EVERY} == 0)")
    vocab_size = head["vocab_size"]
    digest, counts = hashlib.sha256(), np.zeros(vocab_size, dtype=np.int64)
    for split in ("train", "val"):
        ids = np.memmap(partial / f"{split}.bin", dtype=dtype, mode="r")
        for start in range(0, len(ids), BLOCK):
            block = np.asarray(ids[start:start + BLOCK])
            digest.update(block.tobytes())
            if split == "val":
                counts += np.bincount(block, minlength=vocab_size)
        del ids
    val_documents = -(-done["documents"] // VAL_EVERY)  # documents 0, VAL_EVERY, 2 VAL_EVERY, ... below the count
    source = {**head["source"], "documents": done["documents"], "val_documents": val_documents,
              "train_documents": done["documents"] - val_documents, "sha256": digest.hexdigest(),
              "sha256_of": "train.bin then val.bin",
              "val_split": f"document i (from 0, in the stream's order) when i % {VAL_EVERY} == 0"}
    meta = {**head, "train_tokens": done["train_tokens"], "val_tokens": done["val_tokens"], "source": source,
            "unigram_entropy": entropy(counts)}
    try:
        write_and_sync(partial / "meta.json", json.dumps(meta, indent=2).encode())
        os.remove(partial / PROGRESS)
        if folder.exists():
            shutil.rmtree(folder)  # a preparation stopped before it was whole (no meta.json)
        os.replace(partial, folder)
    except OSError as e:
        raise cannot_write(folder, e) from None


def entropy(counts):
    """Entropy in nats of the distribution that token counts make (data.unigram_entropy's formula)."""
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
