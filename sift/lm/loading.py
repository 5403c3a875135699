"""Load any Hugging Face causal LM by local path, cached hub name, or local GGUF file — never downloading.

sift never fetches weights at run time (docs/design.md §2): a hub name must already be in the local Hugging Face
cache; otherwise loading fails at once with one clear line instead of hanging on a network.

A GGUF file is de-quantised by transformers once and kept as a safetensors model folder (float32) in
``<cache>/gguf/<stem>-<sha256[:16]>/`` (``<cache>`` = ``$SIFT_CACHE`` or ``~/.cache/sift``); later loads, and
other stages (hidden-state extraction, vLLM), use that folder (:func:`resolve_model_path`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from sift.errors import PermanentError, SiftError

GGUF_MAGIC = b"GGUF"


def is_gguf(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(4) == GGUF_MAGIC


# GGUF metadata value types: struct format of the fixed-size ones (8 = string, 9 = array)
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class _Header:
    """A little-endian reader over a GGUF file's header (raises EOFError past the end)."""

    def __init__(self, fh):
        self.fh = fh

    def read(self, fmt: str):
        import struct

        n = struct.calcsize("<" + fmt)
        b = self.fh.read(n)
        if len(b) < n:
            raise EOFError
        return struct.unpack("<" + fmt, b)[0]

    def string(self) -> str:
        n = self.read("Q")
        if n > 1 << 24:
            raise ValueError(f"a string of {n} bytes")
        b = self.fh.read(n)
        if len(b) < n:
            raise EOFError
        return b.decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype in _GGUF_SCALARS:
            return self.read(_GGUF_SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, n = self.read("I"), self.read("Q")
            if n > 16 and etype in _GGUF_SCALARS:  # long arrays of numbers (token types, scores): skipped
                import struct

                self.fh.seek(n * struct.calcsize("<" + _GGUF_SCALARS[etype]), 1)
                return None
            items = [self.value(etype) for _ in range(n)]
            return items if n <= 16 else None  # long arrays (the vocabulary) are read past, not kept
        raise ValueError(f"unknown metadata value type {vtype}")


def gguf_header(path: str | Path) -> dict:
    """The header of a GGUF file: ``metadata`` (short values only), and ``data_end``, the byte where its tensor
    data ends (None when a tensor type's size is unknown); raises EOFError for a file cut inside its header."""
    try:
        from gguf.constants import GGML_QUANT_SIZES  # (block size, bytes per block) per tensor type
        sizes = {int(k): v for k, v in GGML_QUANT_SIZES.items()}
    except ImportError:  # pragma: no cover  (transformers needs the gguf package to read GGUF files anyway)
        sizes = {}
    with open(path, "rb") as fh:
        h = _Header(fh)
        if fh.read(4) != GGUF_MAGIC:
            raise ValueError("no GGUF magic bytes")
        version = h.read("I")
        n_tensors, n_kv = h.read("Q"), h.read("Q")
        meta = {}
        for _ in range(n_kv):
            key = h.string()
            meta[key] = h.value(h.read("I"))
        end: int | None = 0
        for _ in range(n_tensors):
            h.string()
            dims = [h.read("Q") for _ in range(h.read("I"))]
            ttype, offset = h.read("I"), h.read("Q")
            n = 1
            for d in dims:
                n *= d
            if ttype in sizes and end is not None:
                block, nbytes = sizes[ttype]
                end = max(end, offset + n // block * nbytes)
            else:
                end = None
        align = int(meta.get("general.alignment") or 32)
        start = -(-fh.tell() // align) * align
    return {"version": version, "metadata": meta, "tensors": n_tensors,
            "data_end": None if end is None else start + end}


def check_gguf(path: str | Path) -> None:
    """Refuse a GGUF file that is not one, or that is shorter than its header says (a truncated download or
    copy), naming the file and both sizes."""
    path = Path(path)
    size = path.stat().st_size
    try:
        head = gguf_header(path)
    except EOFError:
        raise PermanentError(f"{path}: truncated GGUF file ({size:,} bytes end inside its header)") from None
    except (ValueError, OSError) as e:
        raise PermanentError(f"{path}: not a readable GGUF file ({e})") from None
    if head["data_end"] is not None and head["data_end"] > size:
        raise PermanentError(f"{path}: truncated GGUF file: {size:,} bytes, its header needs "
                             f"{head['data_end']:,} (copy or download it again)")


def model_name(name_or_path: str) -> str:
    """The name traces and reports give a model: a GGUF file's stem (e.g. ``qwen2.5-coder-0.5b-instruct-q4_k_m``),
    a converted GGUF folder's source stem, a folder's ``_name_or_path`` from its config.json when that is a hub
    name (else the folder's name), a hub name as given."""
    path = Path(os.path.expanduser(name_or_path.rstrip("/")))
    if path.is_file():
        return path.stem.lower() if path.suffix.lower() == ".gguf" else path.name
    if path.is_dir():
        try:
            src = json.loads((path / RECORD).read_text()).get("source")
            return Path(src).stem.lower()
        except (OSError, ValueError, AttributeError, TypeError):
            pass
        try:
            named = str(json.loads((path / "config.json").read_text()).get("_name_or_path") or "")
        except (OSError, ValueError, AttributeError):
            named = ""
        return named if named and not _looks_like_path(named) and not Path(named).is_absolute() else path.name
    return name_or_path


def check_model(name_or_path: str) -> None:
    """Fail at once, naming the model, if it cannot be loaded: a missing or unreadable path, a file that is not a
    GGUF (magic bytes) or is truncated, a folder without config.json, a hub name not in the local cache."""
    path = Path(os.path.expanduser(name_or_path))
    if path.exists():
        if not os.access(path, os.R_OK):
            raise PermanentError(f"{path}: cannot read the model (permission denied)")
        if path.is_file():
            try:
                gguf = is_gguf(path)
            except OSError as e:
                raise PermanentError(f"{path}: cannot read the model ({e.strerror or e})") from None
            if not gguf:
                raise PermanentError(f"{path}: not a GGUF file (expected the magic bytes 'GGUF'); "
                                     "pass a model folder or a .gguf file")
            check_gguf(path)
        elif not (path / "config.json").exists():
            raise PermanentError(f"{path}: no config.json; not a Hugging Face model folder")
        return
    if _looks_like_path(name_or_path):
        raise PermanentError(f"model path does not exist: {name_or_path}")
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name_or_path, "config.json")
    except Exception:  # an invalid repo id
        found = None
    if not isinstance(found, str):
        raise PermanentError(f"model {name_or_path!r} is neither a local path nor in the local Hugging Face cache; "
                             "sift never downloads at run time — fetch it beforehand or pass a local folder or "
                             ".gguf file")


HASH_BLOCK = 8 << 20  # GGUF files are hashed in 8 MB blocks
RECORD = "sift_gguf.json"  # written last into a converted folder: its presence marks the folder complete


def cache_root() -> Path:
    """sift's cache folder: ``$SIFT_CACHE`` or ``~/.cache/sift``."""
    return Path(os.path.expanduser(os.environ.get("SIFT_CACHE") or "~/.cache/sift"))


def _atomic_write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(HASH_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def gguf_sha256(path: str | Path) -> str:
    """SHA-256 of a GGUF file's bytes, remembered in a sidecar json keyed by the file's path, size and mtime."""
    path = Path(os.path.expanduser(str(path))).resolve()
    st = path.stat()
    key = {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    sidecar = cache_root() / "gguf" / ".hashes" / (hashlib.sha256(str(path).encode()).hexdigest()[:16] + ".json")
    try:
        rec = json.loads(sidecar.read_text())
        if {k: rec.get(k) for k in key} == key and len(rec.get("sha256", "")) == 64:
            return rec["sha256"]
    except (OSError, ValueError, AttributeError):
        pass
    digest = _sha256_file(path)
    try:
        _atomic_write_json(sidecar, {**key, "sha256": digest})
    except OSError:  # a read-only cache only costs a rehash next time
        pass
    return digest


def gguf_cache_folder(path: str | Path) -> Path:
    """Where the GGUF file at ``path`` is (or will be) converted to: ``<cache>/gguf/<stem>-<sha256[:16]>``."""
    path = Path(os.path.expanduser(str(path)))
    return cache_root() / "gguf" / f"{path.stem}-{gguf_sha256(path)[:16]}"


def _complete(folder: Path) -> bool:
    return (folder / RECORD).is_file() and (folder / "config.json").is_file()


def _gguf_to_folder(path: Path, out: Path) -> None:
    """De-quantise the GGUF file at ``path`` into the model folder ``out``, one tensor at a time
    (:func:`sift.lm.gguf_convert.gguf_to_folder`: the same tensors as transformers' GGUF loader, at a third of its
    peak memory)."""
    from sift.lm.gguf_convert import gguf_to_folder

    gguf_to_folder(path, out, progress=False)


def convert_gguf(path: str | Path) -> Path:
    """The converted folder of a GGUF file, converting it first if no complete folder exists yet.

    The conversion is written into a temporary folder beside the target and renamed into place, so a folder at
    the target path is always complete; a file lock keeps concurrent processes from converting the same file
    twice, and if a second writer still races in, it keeps the first writer's folder and drops its own.
    """
    from filelock import FileLock

    path = Path(os.path.expanduser(str(path))).resolve()
    folder = gguf_cache_folder(path)
    if _complete(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder.parent / f".{folder.name}.lock")):
        if _complete(folder):
            return folder
        for old in folder.parent.glob(f".{folder.name}.tmp-*"):  # left by a writer that died (we hold the lock)
            shutil.rmtree(old, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
        try:
            try:
                _gguf_to_folder(path, tmp)
            except Exception as e:  # transformers raises many types for a bad GGUF
                raise PermanentError(f"{path} ({path.stat().st_size:,} bytes): could not load GGUF model "
                                     f"({type(e).__name__}: {(str(e).splitlines() or [''])[0]}); a truncated file "
                                     f"fails so (copy or download it again)") from e
            import transformers

            from sift import __version__

            _atomic_write_json(tmp / RECORD, {
                "source": str(path), "sha256": gguf_sha256(path), "size": path.stat().st_size,
                "transformers_version": transformers.__version__, "sift_version": __version__,
                "dtype": "float32", "converter": "sift.lm.gguf_convert",
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
            if folder.exists() and not _complete(folder):  # incomplete (not written by us): move it aside
                stale = folder.parent / f".{folder.name}.tmp-stale-{uuid.uuid4().hex}"
                os.rename(folder, stale)
                shutil.rmtree(stale, ignore_errors=True)
            mask = _umask()  # mkdtemp (and some writers) make files private; a shared cache should be readable
            os.chmod(tmp, 0o777 & ~mask)
            for f in tmp.rglob("*"):
                os.chmod(f, (0o777 if f.is_dir() else 0o666) & ~mask)
            try:
                os.rename(tmp, folder)
            except OSError:
                if not _complete(folder):  # another writer's complete folder is fine; anything else is not
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return folder


def resolve_model_path(name_or_path: str) -> str:
    """The folder a GGUF file is converted to (converting it if needed); any other name or path unchanged."""
    path = Path(os.path.expanduser(name_or_path))
    if path.is_file() and is_gguf(path):
        return str(convert_gguf(path))
    return name_or_path


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.endswith(".gguf") or os.sep in name and name.count("/") != 1


#: the model dtypes a config may name (``auto``: :func:`resolve_dtype`; None: as saved)
DTYPES = ("auto", "float32", "bfloat16", "float16")


def resolve_dtype(dtype: str | None, device: str = "cpu") -> str | None:
    """The dtype a model loads in: ``auto`` is bfloat16 where the hardware computes it natively (a CUDA GPU that
    supports it; a CPU with AMX tiles or AVX512-BF16, where it is 2–3× faster than float32), else float32.

    bfloat16 changes greedy ids and hidden states against float32, so the resolved name enters corpus and cache
    keys, never ``auto`` itself."""
    import torch

    if dtype is not None and dtype not in DTYPES:
        raise SiftError(f"dtype: expected one of {', '.join(DTYPES)} or null, got {dtype!r}")
    if dtype != "auto":
        return dtype
    if str(device).startswith("cuda"):
        return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float32"
    # torch.cpu's feature probes are private but stable since torch 2.1; a missing probe means "no"
    probes = [getattr(torch.cpu, n, None) for n in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")]
    return "bfloat16" if any(p is not None and p() for p in probes) else "float32"


def load_causal_lm(name_or_path: str, *, device: str = "cpu", dtype: str | None = None):
    """(model, tokenizer) for a local folder, a local ``.gguf`` file or a hub name already in the cache;
    ``dtype``: one of :data:`DTYPES` (None: as saved)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sift.lm.weights import load_streaming

    kwargs: dict = {"local_files_only": True}
    dtype = resolve_dtype(dtype, device)
    if dtype is not None:
        kwargs["dtype"] = getattr(torch, dtype)
    path = Path(os.path.expanduser(name_or_path))
    if path.is_file():
        check_model(str(path))
        path = convert_gguf(path)  # de-quantised once, then loaded as a model folder
    if path.is_dir():
        if not (path / "config.json").exists():
            raise PermanentError(f"{path}: no config.json; not a Hugging Face model folder")
        try:
            tok = AutoTokenizer.from_pretrained(str(path), **kwargs)
            # streamed tensor by tensor where the folder's names are the model's (peak: the model plus one
            # tensor, sift.lm.weights); else transformers' loader
            model = load_streaming(path, dtype)
            if model is None:
                model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
        except PermanentError:
            raise
        except Exception as e:
            raise PermanentError(f"{path}: could not load model ({type(e).__name__}: {str(e).splitlines()[0]})") from e
    elif _looks_like_path(name_or_path):
        raise PermanentError(f"model path does not exist: {name_or_path}")
    else:
        try:
            tok = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs)
        except Exception as e:
            raise PermanentError(
                f"model {name_or_path!r} is neither a local path nor in the local Hugging Face cache; sift never "
                f"downloads at run time — fetch it beforehand or pass a local folder or .gguf file") from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if path.is_dir():
        from sift.lm.adapter import load_adapter
        from sift.lm.latent import answer_id_of, attach_adapter, attach_direction, load_direction

        direction = load_direction(path)  # an organism's mechanism latent (sift.organism.latent); real LMs: none
        if direction is not None:
            attach_direction(model, direction.to(device), answer_id_of(tok))
        adapter = load_adapter(path, model.config.num_attention_heads)  # a cot_routing organism's query adapter
        if adapter is not None:
            model.to(device)
            attach_adapter(model, adapter.eval(), answer_id_of(tok))
    model.to(device).eval()
    return model, tok
