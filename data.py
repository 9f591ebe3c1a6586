"""
Corpora and tokenizers: text -> token ids in uint16/uint32 memmaps, and random batches from them.

prepare() writes <data_dir>/<name>-<tokenizer>/ with train.bin, val.bin (the first 90% and the last 10%
of the tokens) and meta.json; get_batch() samples (x, y) from them. As a script it prepares one corpus:
    python data.py --dataset=builtin --tokenizer=byte
Datasets: builtin (the running Python's standard library source, no download), shakespeare (tiny
Shakespeare, downloaded once), or a path to a text file or a folder of text files.
Tokenizers: byte (every byte is a token, vocab 256) and gpt2 (GPT-2 BPE, vocab 50257).
"""
import argparse
import fcntl
import functools
import hashlib
import json
import os
import platform
import sys
import sysconfig
import urllib.request
from pathlib import Path

import numpy as np
import tiktoken
from tiktoken_ext.openai_public import r50k_pat_str

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TOKENIZERS = ("byte", "gpt2")


class DataError(Exception):
    """A problem with the data that a person can fix; the message is one line saying what and how."""


def get_tokenizer(name):
    if name == "byte":
        # 256 single-byte ranks and no merges: each UTF-8 byte is its own token and its id is the byte
        return tiktoken.Encoding(name="byte", pat_str=r50k_pat_str, special_tokens={},
                                 mergeable_ranks={bytes([i]): i for i in range(256)})
    if name == "gpt2":
        try:
            # r50k_base is GPT-2's BPE (same ranks, split pattern and <|endoftext|> = 50256) stored as one
            # .tiktoken file; the "gpt2" name needs two other files, which the shared offline cache lacks
            return tiktoken.get_encoding("r50k_base")
        except Exception as e:
            raise DataError(f"could not load the gpt2 tokenizer ({type(e).__name__}); offline, set "
                            "TIKTOKEN_CACHE_DIR to a folder holding GPT-2's cached ranks (tiktoken's cache), "
                            "(see README: GPT-2's BPE)") from e
    raise DataError(f"--tokenizer={name} is not a tokenizer; choose one of {', '.join(TOKENIZERS)}")


def token_dtype(vocab_size):
    # ids run from 0 to vocab_size - 1; uint16 holds up to 65535
    return np.uint16 if vocab_size <= 65536 else np.uint32


def skipped(name):
    # installed packages are not the stdlib, and tests are mostly fixtures and asserts
    return name in ("site-packages", "dist-packages", "test", "tests", "idle_test") or name.startswith("test_")


def read_text(path):
    # bytes, then decode: text mode would turn \r\n into \n and the tokens would not decode to the file
    return Path(path).read_bytes().decode("utf-8", errors="replace")


def read_utf8(path):
    """The file's text if it is UTF-8 text (decodes strictly, holds no NUL byte), else None: a binary or
    latin-1 file would otherwise train the model on replacement characters."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\0" in text else text


def builtin_files():
    """The stdlib's own *.py files, without installed packages and tests: (root, sorted relative paths)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not skipped(d)]  # in place: os.walk does not descend into them
        rel = Path(dirpath).relative_to(root)
        files += [(rel / f).as_posix() for f in filenames if f.endswith(".py") and not skipped(f)]
    return root, sorted(files)


def folder_files(root):
    """The texts of the files under root that are UTF-8 text (read_utf8), in sorted path order; hidden files
    and folders (names starting with '.') are skipped."""
    texts = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and not any(p.startswith(".") for p in rel.parts):
            texts.append(read_utf8(path))
    return [text for text in texts if text is not None]


def download(url, path):
    if path.exists():
        return
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            text = r.read()
    except (OSError, ValueError) as e:
        raise DataError(f"could not download {url} ({getattr(e, 'reason', e)}); without network, put tiny "
                        f"Shakespeare's input.txt at {path} by hand and run again") from e
    path.parent.mkdir(parents=True, exist_ok=True)  # after the download: a failed one leaves nothing behind
    write_atomic(path, text)


def corpus_name(dataset):
    if dataset in ("builtin", "shakespeare"):
        return dataset
    path = Path(dataset).resolve()
    # the hash keeps two different paths with the same basename apart
    return f"{path.name}-{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"


def read_corpus(dataset, data_dir, url):
    """Returns (text, source): the corpus as one string and a description of what was read."""
    if dataset == "builtin":
        root, files = builtin_files()
        text = "\n".join(read_text(root / f) for f in files)
        return text, dict(dataset="builtin", path=str(root), files=len(files), python=platform.python_version())
    if dataset == "shakespeare":
        url = url or SHAKESPEARE_URL
        path = Path(data_dir) / "shakespeare" / "input.txt"
        download(url, path)
        return read_text(path), dict(dataset="shakespeare", path=str(path), url=url, files=1)
    path = Path(dataset).resolve()
    if not path.exists():
        raise DataError(f"--dataset={dataset}: no such file or folder; use builtin, shakespeare, "
                        "or a path to a text file or a folder of text files")
    if path.is_file():
        text = read_utf8(path)
        if text is None:
            raise DataError(f"--dataset={dataset} is not UTF-8 text (it holds NUL bytes or is in another encoding, "
                            "such as latin-1); convert it to UTF-8, e.g. iconv -f latin1 -t utf-8")
        return text, dict(dataset=dataset, path=str(path), files=1)
    texts = folder_files(path)
    return "\n".join(texts), dict(dataset=dataset, path=str(path), files=len(texts))


def unigram_entropy(ids, vocab_size):
    """Entropy in nats/token of the empirical unigram distribution: the loss of the best model that
    ignores context, so a model must get below it to have learned anything from context."""
    counts = np.bincount(ids, minlength=vocab_size)
    p = counts[counts > 0] / len(ids)
    return float(-(p * np.log(p)).sum())


def write_atomic(path, data):
    # a temporary name in the same folder, then a rename: readers see the whole file or none of it
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def encode(enc, text):
    """The token ids of text as a numpy array."""
    if enc.name == "byte":
        # the byte tokenizer has no merges, so its ids are the UTF-8 bytes: numpy reads them in milliseconds,
        # where tiktoken's per-piece loop takes seconds on the 12 MB builtin corpus
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    # encode_ordinary: "<|endoftext|>" in a source file is plain text, not a special token
    return np.array(enc.encode_ordinary(text))


def write_prepared(folder, enc, text, source, tokenizer):
    dtype = token_dtype(enc.n_vocab)
    ids = encode(enc, text).astype(dtype)
    n_train = len(ids) * 9 // 10  # integer arithmetic: no float rounding in the split
    train, val = ids[:n_train], ids[n_train:]
    folder.mkdir(exist_ok=True)
    write_atomic(folder / "train.bin", train)
    write_atomic(folder / "val.bin", val)
    meta = dict(tokenizer=tokenizer, vocab_size=enc.n_vocab, dtype=np.dtype(dtype).name,
                train_tokens=len(train), val_tokens=len(val), source=source,
                unigram_entropy=unigram_entropy(val, enc.n_vocab))
    write_atomic(folder / "meta.json", json.dumps(meta, indent=2).encode())  # last: its presence means complete


def prepare(dataset="builtin", tokenizer="byte", data_dir="data", url=None):
    """Tokenizes the corpus into <data_dir>/<name>-<tokenizer>/ unless its meta.json exists; returns the folder
    after checking it (load_meta). Every process may call it at once: one process per data_dir (per disk)
    tokenizes while the others wait on a file lock, then all find the same folder."""
    if url is not None and dataset != "shakespeare":
        raise DataError(f"--url only applies to --dataset=shakespeare, not --dataset={dataset}")
    if not dataset.strip():
        raise DataError("--dataset is empty (it would read the current folder); use builtin, shakespeare, "
                        "or a path to a text file or a folder of text files")
    folder = Path(data_dir) / f"{corpus_name(dataset)}-{tokenizer}"
    if not (folder / "meta.json").exists():
        enc = get_tokenizer(tokenizer)  # before reading the corpus, so a bad name fails at once
        try:
            # read and checked before the lock: a bad corpus writes nothing, not even the lock file
            text, source = read_corpus(dataset, data_dir, url)
            if not text.strip():
                raise DataError(f"--dataset={dataset} holds no text (UTF-8 text files read: {source['files']}); "
                                "give a non-empty UTF-8 text file or a folder holding some")
            folder.parent.mkdir(parents=True, exist_ok=True)
            # flock, not a marker file: the kernel releases it when its holder exits, even on kill -9. The lock
            # file stays: removing it would let a third process lock a new file while the first holds the old one
            with open(f"{folder}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not (folder / "meta.json").exists():  # another process may have prepared it while this one waited
                    write_prepared(folder, enc, text, source, tokenizer)
        except OSError as e:
            raise DataError(f"cannot read or write {e.filename or data_dir} ({e.strerror}); --dataset must be "
                            f"readable and --data_dir={data_dir} a folder you can write to") from e
    load_meta(folder)
    return str(folder)


META_TYPES = dict(tokenizer=str, vocab_size=int, dtype=str, train_tokens=int, val_tokens=int, source=dict,
                  unigram_entropy=float)


def load_meta(folder):
    """meta.json of a prepared folder, checked against train.bin and val.bin. A damaged folder is a DataError
    naming what is wrong; nothing on disk is changed."""
    path = Path(folder) / "meta.json"
    if not path.exists():
        raise DataError(f"{folder} is not a prepared dataset (no meta.json); run python data.py --dataset=...")
    damaged = f"{folder} is a damaged prepared dataset; delete the folder and run again to prepare it anew:"
    try:
        meta = json.loads(path.read_bytes())
    except ValueError:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise DataError(f"{damaged} meta.json is not JSON") from None
    except OSError as e:
        raise DataError(f"cannot read {path} ({e.strerror})") from e
    for key, kind in META_TYPES.items():
        value = meta.get(key) if isinstance(meta, dict) else None
        # bool is an int to Python, and json writes a float that is whole as 2.0, never as 2
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 0):
            raise DataError(f"{damaged} meta.json's {key} is {value!r} (wanted: {kind.__name__}"
                            f"{' >= 0' if kind is int else ''})")
    dtype = np.dtype(token_dtype(meta["vocab_size"])).name
    if meta["dtype"] != dtype:
        raise DataError(f"{damaged} meta.json's dtype is {meta['dtype']}, but a vocab of {meta['vocab_size']} is "
                        f"stored as {dtype}")
    for split in ("train", "val"):
        expected = meta[f"{split}_tokens"] * np.dtype(dtype).itemsize
        try:
            size = (Path(folder) / f"{split}.bin").stat().st_size
        except FileNotFoundError:
            raise DataError(f"{damaged} {split}.bin is missing") from None
        if size != expected:
            raise DataError(f"{damaged} {split}.bin has {size} bytes, but meta.json's {meta[f'{split}_tokens']} "
                            f"{dtype} tokens take {expected}")
    return meta


def check_length(meta, block_size):
    for split in ("train", "val"):
        n = meta[f"{split}_tokens"]
        if n <= block_size:
            raise DataError(f"the {split} split has {n} tokens, too few for --block_size={block_size} (it needs "
                            "more than block_size); use a smaller --block_size or a bigger corpus")


@functools.cache
def bin_dtype(folder):
    # read once per folder, not at every micro-step; a folder's tokenizer, and so its dtype, is in its name
    return load_meta(folder)["dtype"]


def get_batch(folder, split, batch_size, block_size, generator, device):
    """x: batch_size random windows of block_size tokens from split; y: the same windows one token later."""
    import torch  # here, not at the top: python data.py never needs it and starts in a tenth of the time
    dtype = bin_dtype(str(folder))
    # a fresh memmap every call, as in nanoGPT: a long-lived one grows the process's memory
    data = np.memmap(os.path.join(folder, f"{split}.bin"), dtype=dtype, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator).tolist()
    x = torch.from_numpy(np.stack([data[i:i + block_size] for i in ix]).astype(np.int64))
    y = torch.from_numpy(np.stack([data[i + 1:i + 1 + block_size] for i in ix]).astype(np.int64))
    if torch.device(device).type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


def fail(message):
    print(f"data.py: {' '.join(str(message).split())}", file=sys.stderr)
    sys.exit(2)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Tokenize a corpus into train.bin/val.bin/meta.json.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    parser.add_argument("--dataset", default="builtin",
                        help="builtin, shakespeare, or a path to a UTF-8 text file or a folder of text files")
    parser.add_argument("--tokenizer", default="byte", help=" or ".join(TOKENIZERS))
    parser.add_argument("--data_dir", default="data", help="where the prepared folders go")
    parser.add_argument("--url", default=None, help="where to download shakespeare from (file:// works)")
    parser.error = fail  # one line and exit code 2 instead of argparse's usage block
    args = parser.parse_args(argv)
    try:
        folder = prepare(args.dataset, args.tokenizer, args.data_dir, args.url)
        meta = load_meta(folder)
    except DataError as e:
        fail(e)
    print(f"{folder}: {meta['train_tokens']:,} train and {meta['val_tokens']:,} val tokens ({meta['dtype']}), "
          f"vocab {meta['vocab_size']}, {meta['source']['files']} files read")
    print(f"unigram entropy of val: {meta['unigram_entropy']:.4f} nats/token")


if __name__ == "__main__":
    main()
