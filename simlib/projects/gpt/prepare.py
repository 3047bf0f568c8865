"""Data for the GPU-size GPT: download a public corpus once, check it, tokenise it to memory-mapped uint16 files.

    simlib prepare gpt                                 # TinyStories (V2, GPT-4 stories) -> ~/.cache/simlib/gpt/tinystories
    simlib prepare gpt --corpus /data/my_text.txt       # offline: any local UTF-8 text file
    simlib train gpt --size gpu                         # reads the prepared folder by itself

No registry package ships the >= 100 MB of prose a GPU run needs, so this step downloads, as nanoGPT's
``prepare.py`` does; nothing else in the course does. The folder it writes:

    raw/<file>        the downloaded text (kept: a re-run verifies it and downloads nothing)
    tokenizer.json    a byte-level BPE trained here (Hugging Face ``tokenizers``) on the first 100 MB of training
                      text; ``<|endoftext|>`` (TinyStories' story separator) is one token
    train.bin, val.bin  token ids as raw uint16 (``numpy.memmap``-able; the vocabulary is <= 65,536)
    meta.json         written last: sizes, checksums, token counts, the unigram baseline (its presence marks a
                      finished folder)

Downloads resume: an interrupted file is kept as ``<file>.part`` and the next run asks the server for the rest
(HTTP ``Range``). A file whose sha256 differs from the one stated here (or given with ``--sha256``) is refused and
deleted. Offline (a cluster's compute nodes often are): run ``simlib prepare gpt`` on the login node (same shared
file system) or on any machine with internet and copy the folder, then give ``--task.corpus FOLDER``
(``SIMLIB_DATA`` moves the default place); or give ``--corpus`` a local text file.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .text import default_folder, encode_long, read_meta, tokenizer, train_tokenizer, unigram_cross_entropy

SPECIAL = "<|endoftext|>"
TOKENIZER_SAMPLE_BYTES = 100 * 2**20  # BPE trained on this much training text
ENCODE_CHUNK_BYTES = 8 * 2**20  # text encoded (in parallel) per read


@dataclass(frozen=True)
class Source:
    """One file to download: its URL, and what it must be (``None``: not stated; checked when given)."""

    url: str
    size: int | None = None  # bytes; else the server's Content-Length is what "complete" means
    sha256: str | None = None  # the published checksum; else the one measured at the first download is kept


@dataclass(frozen=True)
class Corpus:
    name: str
    train: Source
    valid: Source | None
    licence: str
    about: str


_HF = "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/"
CORPORA = {
    # Eldan & Li 2023, "TinyStories": short stories written by GPT-4 with a 3-4-year-old's vocabulary; the V2
    # files hold the GPT-4 stories only, separated by <|endoftext|>. The train file is about 2.2 GB, the valid
    # file about 22 MB (the dataset's file listing). Their sha256 is not stated here because it could not be
    # read from this offline machine: the first download records it in meta.json and every later run checks
    # against that; pass --sha256 (Hugging Face shows each file's "SHA256" on its page) to check the first too.
    "tinystories": Corpus(
        "tinystories",
        Source(_HF + "TinyStoriesV2-GPT4-train.txt"),
        Source(_HF + "TinyStoriesV2-GPT4-valid.txt"),
        licence="CDLA-Sharing-1.0 (the dataset card of roneneldan/TinyStories)",
        about="TinyStories V2 (GPT-4 stories), Eldan & Li 2023",
    ),
}


def default_corpus() -> str:
    """The prepared TinyStories folder if it is finished, else "" (the shipped corpus)."""
    folder = default_folder("tinystories")
    return str(folder) if (folder / "meta.json").exists() else ""


# ---- download ----
def sha256_of(path, chunk: int = 2**22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _offline_help(url: str) -> str:
    return (
        f"could not reach {url}. Offline? Run `simlib prepare gpt` where there is internet (a cluster's login "
        "node, your laptop) and copy the folder, then --task.corpus FOLDER; or prepare a local text file with "
        "`simlib prepare gpt --corpus FILE.txt`"
    )


def download(source: Source, dest, timeout: float = 60.0, log=print) -> str:
    """Download ``source`` to ``dest`` once; resume a ``dest.part`` left by an interrupted run (HTTP Range); check
    size and sha256. Returns the file's sha256. A finished ``dest`` is verified, not downloaded again."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        digest = sha256_of(dest)
        _check_sha(source, dest, digest)
        return digest
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(source.url, headers={"User-Agent": "simlib-prepare"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have and (source.size is None or have == source.size):
            response = None  # the .part is already whole: the server has nothing after it
        else:
            raise OSError(f"{source.url}: HTTP {exc.code} {exc.reason}") from None
    except (TimeoutError, urllib.error.URLError, ConnectionError) as exc:
        raise OSError(_offline_help(source.url) + f" ({exc})") from None
    total = source.size
    if response is not None:
        with response:
            if have and response.status == 206:
                mode = "ab"
                rng = response.headers.get("Content-Range", "")  # bytes a-b/total
                if rng.rpartition("/")[2].isdigit():
                    total = total or int(rng.rpartition("/")[2])
                log(f"resuming {dest.name} at {have:,} bytes")
            else:
                mode, have = "wb", 0  # no Range support: from the start
                length = response.headers.get("Content-Length")
                total = total or (int(length) if length and length.isdigit() else None)
            got = have
            try:
                with open(part, mode) as f:
                    while block := response.read(2**20):
                        f.write(block)
                        got += len(block)
                    f.flush()
                    os.fsync(f.fileno())
            except (TimeoutError, http.client.HTTPException, ConnectionError, OSError) as exc:
                raise OSError(
                    f"download of {dest.name} interrupted at {got:,} of "
                    f"{f'{total:,}' if total else 'unknown'} bytes ({type(exc).__name__}): run the same "
                    "command again to resume"
                ) from None
    size = part.stat().st_size
    if total is not None and size != total:
        raise OSError(
            f"download of {dest.name} stopped at {size:,} of {total:,} bytes: run the same command again to resume"
        )
    digest = sha256_of(part)
    _check_sha(source, part, digest)
    os.replace(part, dest)
    log(f"downloaded {dest.name}: {size:,} bytes, sha256 {digest}")
    return digest


def _check_sha(source: Source, path: Path, digest: str) -> None:
    if source.sha256 and digest != source.sha256.lower():
        path.unlink()
        raise ValueError(
            f"{path.name}: sha256 {digest} is not the expected {source.sha256}: the file is damaged "
            "or changed upstream, so it was deleted; run again to download it afresh (or give the "
            "new file's --sha256 if the publisher changed it)"
        )


CHECKSUMS = "raw/sha256.json"  # the downloaded files' checksums, written as soon as they are known


def recorded_checksums(folder) -> dict:
    """The checksums an earlier run recorded for ``folder``'s downloads: ``raw/sha256.json`` (written right after
    the download, so a tokenisation stopped half-way keeps it), else a finished folder's ``meta.json``."""
    folder = Path(folder)
    recorded = read_meta(folder).get("sha256", {}) if (folder / "meta.json").exists() else {}
    path = folder / CHECKSUMS
    if path.exists():
        recorded = {**recorded, **json.loads(path.read_text())}
    return recorded


def _record_checksums(folder: Path, digests: dict) -> None:
    path = folder / CHECKSUMS
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(digests, indent=2) + "\n")
    os.replace(tmp, path)


# ---- tokenise ----
def _read_text(path, limit: int | None = None):
    """A text file in pieces of about ENCODE_CHUNK_BYTES, each ending at a line end (``limit``: stop there)."""
    done = 0
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        rest = ""
        while limit is None or done < limit:
            block = f.read(ENCODE_CHUNK_BYTES)
            if not block:
                break
            block = rest + block
            cut = block.rfind("\n") + 1 or len(block)
            rest = block[cut:]
            done += cut
            yield block[:cut]
        if rest and (limit is None or done < limit):
            yield rest


def _encode_file(path, out, tok, log=print) -> int:
    count = 0
    with open(out, "wb") as f:
        for i, text in enumerate(_read_text(path)):
            ids = encode_long(text, tok)
            ids.tofile(f)
            count += len(ids)
            if i % 16 == 15:  # every ~128 MB of text
                log(f"  {out.name.removesuffix('.tmp')}: {count:,} tokens so far")
    return count


def prepare(
    corpus: str = "tinystories",
    out=None,
    vocab_size: int = 8192,
    sha256: str | None = None,
    valid_fraction: float = 0.01,
    timeout: float = 60.0,
    log=print,
) -> Path:
    """Download (or take the local file ``corpus``), check, train the BPE and tokenise; returns the folder."""
    if not 256 < vocab_size <= 65536:
        raise ValueError(f"vocab_size must be in 257..65536 (byte-level BPE, uint16 ids), got {vocab_size}")
    local = Path(corpus).expanduser()
    if corpus in CORPORA:
        spec = CORPORA[corpus]
        folder = Path(out).expanduser() if out else default_folder(corpus)
        recorded = recorded_checksums(folder)
        train_src = Source(spec.train.url, spec.train.size, sha256 or spec.train.sha256 or recorded.get("train"))
        digests = {"train": download(train_src, folder / "raw" / Path(spec.train.url).name, timeout, log)}
        train_path = folder / "raw" / Path(spec.train.url).name
        valid_path = None
        if spec.valid is not None:
            valid_path = folder / "raw" / Path(spec.valid.url).name
            valid_src = Source(spec.valid.url, spec.valid.size, spec.valid.sha256 or recorded.get("valid"))
            digests["valid"] = download(valid_src, valid_path, timeout, log)
        _record_checksums(folder, digests)  # before tokenising: an interrupted run keeps them (meta.json does not)
        for key, src in (("train", train_src), ("valid", spec.valid)):
            if src is not None and not (src.sha256 or recorded.get(key)):
                log(
                    f"no sha256 stated for {Path(src.url).name}: recorded {digests[key]} in meta.json, which every "
                    "later run checks; compare it with the SHA256 on the dataset's file page"
                )
        source = {
            "name": spec.name,
            "about": spec.about,
            "licence": spec.licence,
            "urls": [spec.train.url] + ([spec.valid.url] if spec.valid else []),
        }
    elif local.is_file():
        folder = Path(out).expanduser() if out else default_folder(local.stem)
        train_path, valid_path = local, None
        digests = {"train": sha256_of(local)}
        if sha256 and digests["train"] != sha256.lower():
            raise ValueError(f"{local}: sha256 {digests['train']} is not the expected {sha256}")
        source = {"name": local.stem, "about": f"local file {local}", "licence": "as its owner states"}
    else:
        raise ValueError(f"--corpus {corpus!r} is neither a known corpus ({', '.join(CORPORA)}) nor a text file")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta.json").unlink(missing_ok=True)  # unfinished until written again
    if valid_path is None:  # one file: the last valid_fraction of it (at a line end) is held out
        valid_path, train_path = _split_file(train_path, folder / "raw", valid_fraction)
    log(f"training a {vocab_size}-token byte-level BPE on the first {TOKENIZER_SAMPLE_BYTES // 2**20} MB")
    tok = train_tokenizer(
        folder / "tokenizer.json", vocab_size, _read_text(train_path, TOKENIZER_SAMPLE_BYTES), special_tokens=[SPECIAL]
    )
    tokenizer.cache_clear()  # a process that read an earlier tokenizer.json from this folder reads the new one
    counts = {}
    for split, path in (("train", train_path), ("val", valid_path)):
        tmp = folder / f"{split}.bin.tmp"
        counts[split] = _encode_file(path, tmp, tok, log)
        os.replace(tmp, folder / f"{split}.bin")
    train = np.memmap(folder / "train.bin", dtype=np.uint16, mode="r")
    val = np.memmap(folder / "val.bin", dtype=np.uint16, mode="r")
    if counts["val"] < 2:
        raise ValueError(f"the held-out split of {corpus!r} has {counts['val']} tokens: give a larger file")
    meta = {
        "source": source,
        "sha256": digests,
        "vocab_size": tok.get_vocab_size(),
        "special": SPECIAL,
        "train_tokens": counts["train"],
        "val_tokens": counts["val"],
        "unigram_cross_entropy": unigram_cross_entropy(train, val, tok.get_vocab_size()),
        "python": sys.version.split()[0],
    }
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    log(
        f"prepared {folder}: {counts['train']:,} training and {counts['val']:,} held-out tokens, "
        f"unigram baseline {meta['unigram_cross_entropy']:.3f} nats/token"
    )
    return folder


def _split_file(path: Path, folder: Path, fraction: float) -> tuple[Path, Path]:
    """(held-out, training) files: the last ``fraction`` of ``path``, cut at a line end, is held out."""
    if not 0 < fraction < 0.5:
        raise ValueError(f"valid_fraction must be in (0, 0.5), got {fraction}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(int(size * (1 - fraction)))
        f.readline()
        cut = f.tell()
    folder.mkdir(parents=True, exist_ok=True)
    train, valid = folder / "train_part.txt", folder / "valid_part.txt"
    with open(path, "rb") as src, open(train, "wb") as t, open(valid, "wb") as v:
        remaining = cut
        while remaining > 0:
            block = src.read(min(2**22, remaining))
            if not block:
                break
            t.write(block)
            remaining -= len(block)
        while block := src.read(2**22):
            v.write(block)
    return valid, train


def add_parser(sub) -> None:
    """``simlib prepare`` on the CLI's sub-parsers."""
    p = sub.add_parser(
        "prepare",
        help="download and tokenise the GPU-size GPT's corpus (the one step that "
        "downloads); or tokenise a local text file",
    )
    p.add_argument("project", choices=["gpt"], help="the project whose data to prepare")
    p.add_argument(
        "--corpus",
        default="tinystories",
        help=f"a corpus name ({', '.join(CORPORA)}) or a local UTF-8 text file (default tinystories)",
    )
    p.add_argument("--out", default=None, help="folder (default $SIMLIB_DATA or ~/.cache/simlib, then gpt/<name>)")
    p.add_argument("--vocab-size", type=int, default=8192, help="BPE vocabulary (<= 65536; default 8192)")
    p.add_argument("--sha256", default=None, help="the training file's expected sha256 (checked before use)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds without data before a download stops")
    p.set_defaults(func=_cli)


def _cli(args) -> int:
    folder = prepare(args.corpus, args.out, args.vocab_size, args.sha256, timeout=args.timeout)
    print(f"train on it: simlib train gpt --size gpu --task.corpus {folder}")
    return 0
