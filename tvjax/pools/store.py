"""Score pools: the on-disk form of the shared currency (realized-token log-probability draws).

A pool holds, for each sampling side ("pi", "mu"), N trajectories of length n, and for every
(side, scorer) pair R replay-scoring passes of realized-token log-probabilities (optionally with the
top-k ids and log-probabilities of every pass). It is a zarr v3 directory store plus a folder of
commit markers. Every chunk is zstd-compressed and then carries a crc32c checksum, so a truncated,
bit-flipped or overwritten chunk file is refused (naming its array and chunk) instead of decoding to
wrong numbers; a deleted chunk file of a committed region is refused too. Since format version 3
every commit marker holds a manifest binding its shard's data to its place: the crc32 of each piece
(the shard's block cut at chunk boundaries) of each array it wrote, and, for draws, the digests of
the tokens shards they scored. So intact data in the wrong place (a chunk file copied over another,
the token arrays of pi and mu swapped, a scorer's directory renamed to another's, tokens rewritten
under draws scored on the old ones) is refused too, naming the array, rows, passes and marker. A
marker that does not parse, lacks a field, or whose key, file name, kind, side, scorer, rows or
passes disagree with each other or with the spec is refused naming the marker file. Pools of
format version 2 (markers without manifests) still load, with a warning that their data's places
are unchecked; a writer resuming one keeps writing version-2 markers.

This module imports no JAX (only numpy, zarr and the standard library): engine bridges import it
inside engine virtualenvs.

Layout of a pool directory::

    POOL/zarr.json                          group; attributes: format_version, spec, metadata
    POOL/tokens/{side}                      int32   [N, n]
    POOL/lengths/{side}                     int32   [N]           (if spec.eos_ids: outputs stop at EOS)
    POOL/sample_logprobs/{side}             float32 [N, n]        (if spec.sample_logprobs)
    POOL/logprobs/{side}/{scorer}           float32 [N, n, R]     (-inf = zero mass)
    POOL/topk_ids/{side}/{scorer}           int32   [N, n, R, k]  (if spec.top_k)
    POOL/topk_logprobs/{side}/{scorer}      float32 [N, n, R, k]  (if spec.top_k)
    POOL/commits/{shard}.json               one marker per committed shard: key, kind, side, scorer,
                                            rows, passes, committed_at, manifest (array path -> pieces:
                                            rows, passes, crc32), tokens (draws: tokens key -> digest)

Writes are shards: a block of rows of a side's tokens (``write_tokens``), or a block
(rows a:b, passes c:d) of one scorer's draws on one side (``write_draws``). Data is written first,
then the shard's marker is committed atomically (temp file + ``os.replace``). Only committed
shards count: a campaign killed mid-shard loses that shard only, and a resumed writer rewrites it.
Committed regions are append-only: a shard that overlaps a committed one is refused, so no
trajectory is ever written twice or lost. Draws come after the tokens they score (their marker names
those tokens shards).

Outputs that stop at EOS (a pool created with `eos_ids`): a trajectory is its tokens up to and
including its first EOS id, then the pad, eos_ids[0], to the end; `lengths` holds its real
positions. Under every scorer a padded position is deterministic: its log-probability is 0 and its
top-k readout is the pad alone (`pad_readout`), so the currency's sums need no mask, and
write_tokens / write_draws / load_pool refuse anything else.

Typical engine use (one replay pass over all N trajectories at a time)::

    writer = create_pool(path, n=500, num_per_side=512, repeats=16, scorers=("vllm", "sglang"),
                         top_k=20, metadata={...}, exist_ok=True)      # exist_ok: resume
    if not writer.is_done(tokens_key("pi", 0, 512)):
        writer.write_tokens("pi", 0, tokens, sample_logprobs=lp)
    for j in range(16):
        if not writer.is_done(draws_key("pi", "vllm", 0, 512, j, j + 1)):
            writer.write_draws("pi", "vllm", 0, j, logprobs[:, :, None], topk_ids=..., topk_logprobs=...)
    pool = load_pool(path)
"""

from __future__ import annotations

import datetime
import hashlib
import itertools
import json
import os
import re
import tempfile
import warnings
import zlib
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from tvjax._extras import require

zarr = require("zarr", "pools", "score pools")

# 2: chunks carry a crc32c checksum (version 1 pools have none and are refused: recreate them)
# 3: commit markers carry a manifest (crc32 of each piece of the shard's data, the tokens draws scored):
#    data in the wrong place is refused. Version 2 pools still load (places unchecked, with a warning).
FORMAT_VERSION = 3
_READABLE = (2, 3)
SIDES = ("pi", "mu")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_COMMITS = "commits"
# zarr's default zstd, then a checksum of the stored bytes: damage is caught before decompression
_COMPRESSORS = (zarr.codecs.ZstdCodec(level=0, checksum=False), zarr.codecs.Crc32cCodec())
_AXES = ("rows", "positions", "passes", "top-k")
_FIELDS = ("key", "kind", "side", "scorer", "rows", "passes", "committed_at")
_TOKENS_KEY = re.compile(r"^tokens\.(pi|mu)\.r(\d+)-(\d+)$")


class PoolError(Exception):
    """A pool is missing, incomplete, damaged, or does not match what was asked of it."""


class PoolSpec(NamedTuple):
    """Declared sizes of a pool.

    n: positions per trajectory; num_per_side: N trajectories per side; repeats: R scoring passes;
    scorers: names of the scoring models/engines (e.g. ("pi", "mu") or ("vllm", "sglang"));
    samplers: (scorer that sampled the pi side, scorer that sampled the mu side), default the first
    two scorers -- this is the pair whose TV is estimated and whose "own tokens" are checked;
    top_k: width k of the stored top-k readout or None; sample_logprobs: whether the log-probs seen at
    sampling time are stored; row_chunk / pass_chunk: zarr chunk sizes along trajectories / passes;
    eos_ids: the EOS ids at which outputs stop (sorted; () = fixed length n, the paper's protocol
    with EOS suppressed), with per-trajectory lengths stored.
    """

    n: int
    num_per_side: int
    repeats: int
    scorers: tuple[str, ...]
    samplers: tuple[str, str]
    top_k: int | None
    sample_logprobs: bool
    row_chunk: int
    pass_chunk: int
    eos_ids: tuple[int, ...] = ()

    @property
    def stops(self) -> bool:
        """Whether outputs stop at EOS (per-trajectory lengths stored)."""
        return bool(self.eos_ids)


class Pool(NamedTuple):
    """A loaded pool: numpy arrays of the currency plus metadata.

    tokens[side]: int32 [N_s, n]; sample_logprobs[side]: float32 [N_s, n] (None if not stored);
    `logprobs[side][scorer]`: float32 [N_s, n, R'] realized-token log-probability draws;
    `topk_ids[side][scorer]`: int32 [N_s, n, R', k] and `topk_logprobs[side][scorer]`: float32
    [N_s, n, R', k] (None if not stored); rows[side]: indices of the loaded trajectories
    (all of 0..N-1 for a complete load); passes: indices of the loaded passes (0..R-1 when complete);
    lengths[side]: int32 [N_s] real positions of each trajectory (n throughout a fixed-length pool).
    """

    spec: PoolSpec
    metadata: dict[str, Any]
    tokens: dict[str, np.ndarray]
    sample_logprobs: dict[str, np.ndarray] | None
    logprobs: dict[str, dict[str, np.ndarray]]
    topk_ids: dict[str, dict[str, np.ndarray]] | None
    topk_logprobs: dict[str, dict[str, np.ndarray]] | None
    rows: dict[str, np.ndarray]
    passes: np.ndarray
    lengths: dict[str, np.ndarray]


def tokens_key(side: str, row_start: int, row_stop: int) -> str:
    """Shard key of tokens (and sample log-probs) rows [row_start, row_stop) of `side`."""
    return f"tokens.{side}.r{row_start}-{row_stop}"


def draws_key(side: str, scorer: str, row_start: int, row_stop: int, pass_start: int, pass_stop: int) -> str:
    """Shard key of `scorer`'s draws on `side`, rows [row_start, row_stop), passes [pass_start, pass_stop)."""
    return f"draws.{side}.{scorer}.r{row_start}-{row_stop}.p{pass_start}-{pass_stop}"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _check_name(kind: str, name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name) or name == _COMMITS:
        raise PoolError(f"invalid {kind} name {name!r}: use letters, digits, '_', '-', '.'")


def make_spec(
    *,
    n: int,
    num_per_side: int,
    repeats: int,
    scorers=("pi", "mu"),
    samplers=None,
    top_k: int | None = None,
    sample_logprobs: bool = False,
    row_chunk: int | None = None,
    pass_chunk: int = 1,
    eos_ids=(),
) -> PoolSpec:
    """Validate declared sizes and return a PoolSpec (row_chunk defaults to min(N, 256))."""
    scorers = tuple(scorers)
    for value, name in ((n, "n"), (num_per_side, "num_per_side"), (repeats, "repeats"), (pass_chunk, "pass_chunk")):
        if int(value) != value or value < 1:
            raise PoolError(f"{name} must be a positive integer, got {value!r}")
    if not scorers or len(set(scorers)) != len(scorers):
        raise PoolError(f"scorers must be distinct and non-empty, got {scorers!r}")
    for s in scorers:
        _check_name("scorer", s)
    samplers = tuple(scorers[:2]) if samplers is None else tuple(samplers)
    if len(samplers) != 2 or any(s not in scorers for s in samplers):
        raise PoolError(f"samplers must be two of the scorers {scorers!r}, got {samplers!r}")
    if top_k is not None and (int(top_k) != top_k or top_k < 1):
        raise PoolError(f"top_k must be None or a positive integer, got {top_k!r}")
    row_chunk = min(int(num_per_side), 256) if row_chunk is None else int(row_chunk)
    if row_chunk < 1:
        raise PoolError(f"row_chunk must be positive, got {row_chunk}")
    eos_ids = tuple(sorted({int(e) for e in (eos_ids or ())}))
    if any(e < 0 for e in eos_ids):
        raise PoolError(f"eos_ids must be token ids (>= 0), got {eos_ids}")
    return PoolSpec(int(n), int(num_per_side), int(repeats), scorers, samplers,
                    None if top_k is None else int(top_k), bool(sample_logprobs), row_chunk, int(pass_chunk), eos_ids)


def _spec_to_json(spec: PoolSpec) -> dict:
    d = spec._asdict()
    d["scorers"] = list(spec.scorers)
    d["samplers"] = list(spec.samplers)
    d["eos_ids"] = list(spec.eos_ids)
    return d


def _spec_from_json(d: dict) -> PoolSpec:
    d = {"eos_ids": [], **d}  # pools written before lengths existed are fixed-length
    missing = [f for f in PoolSpec._fields if f not in d]
    if missing:
        raise PoolError(f"pool spec is missing fields {missing}")
    return make_spec(**{k: d[k] for k in PoolSpec._fields})


def _array_layout(spec: PoolSpec) -> dict[str, tuple[tuple[int, ...], str, tuple[int, ...]]]:
    """Every array path of a pool -> (shape, dtype, chunks)."""
    N, n, R, k = spec.num_per_side, spec.n, spec.repeats, spec.top_k
    rc, pc = min(spec.row_chunk, N), min(spec.pass_chunk, R)
    out = {}
    for side in SIDES:
        out[f"tokens/{side}"] = ((N, n), "int32", (rc, n))
        if spec.stops:
            out[f"lengths/{side}"] = ((N,), "int32", (rc,))
        if spec.sample_logprobs:
            out[f"sample_logprobs/{side}"] = ((N, n), "float32", (rc, n))
        for sc in spec.scorers:
            out[f"logprobs/{side}/{sc}"] = ((N, n, R), "float32", (rc, n, pc))
            if k is not None:
                out[f"topk_ids/{side}/{sc}"] = ((N, n, R, k), "int32", (rc, n, pc, k))
                out[f"topk_logprobs/{side}/{sc}"] = ((N, n, R, k), "float32", (rc, n, pc, k))
    return out


def _write_json_atomic(path: Path, payload: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _shard_arrays(spec: PoolSpec, kind: str, side: str, scorer: str | None) -> list[str]:
    """The arrays a shard of `kind` writes."""
    if kind == "tokens":
        return ([f"tokens/{side}"] + ([f"lengths/{side}"] if spec.stops else [])
                + ([f"sample_logprobs/{side}"] if spec.sample_logprobs else []))
    top = [f"topk_ids/{side}/{scorer}", f"topk_logprobs/{side}/{scorer}"] if spec.top_k is not None else []
    return [f"logprobs/{side}/{scorer}"] + top


def _cuts(span, size: int) -> list[tuple[int, int]]:
    """`span` (start, stop) cut at the multiples of `size`."""
    a, b = span
    edges = [a, *range((a // size + 1) * size, b, size), b]
    return list(zip(edges, edges[1:]))


def _pieces(spec: PoolSpec, rows, passes) -> list[tuple[tuple[int, int], tuple[int, int] | None]]:
    """(rows, passes or None) of each piece of a shard's block: the block cut at chunk boundaries,
    so each piece lies in one chunk."""
    row_pieces = _cuts(rows, min(spec.row_chunk, spec.num_per_side))
    if passes is None:
        return [(r, None) for r in row_pieces]
    return [(r, p) for r in row_pieces for p in _cuts(passes, min(spec.pass_chunk, spec.repeats))]


def _crc(block: np.ndarray) -> int:
    """crc32 of a block's values (C order, little-endian): what binds a piece of data to its marker."""
    return zlib.crc32(np.ascontiguousarray(block, dtype=block.dtype.newbyteorder("<")))


def _manifest(spec: PoolSpec, blocks: dict[str, np.ndarray], rows, passes) -> dict[str, list[dict]]:
    """Array path -> pieces ({rows, passes, crc32}) of the blocks a shard writes at rows (x passes),
    computed from the blocks as written."""
    out = {}
    for name, block in blocks.items():
        pieces = []
        for r, p in _pieces(spec, rows, passes if block.ndim > 2 else None):
            sub = block[r[0] - rows[0]:r[1] - rows[0]]
            if p is not None:
                sub = sub[:, :, p[0] - passes[0]:p[1] - passes[0]]
            pieces.append({"rows": list(r), **({} if p is None else {"passes": list(p)}), "crc32": _crc(sub)})
        out[name] = pieces
    return out


def _digest(rec: dict) -> str:
    """Digest of a tokens marker's manifest: what a draws marker records of the tokens it scored."""
    text = json.dumps(rec.get("manifest"), sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _is_span(x, total: int) -> bool:
    return (isinstance(x, list) and len(x) == 2 and all(type(v) is int for v in x)
            and 0 <= x[0] < x[1] <= total)


def _marker_problem(rec, stem: str, spec: PoolSpec, version: int) -> str | None:
    """What is wrong with a commit marker (None: nothing): fields, names, ranges, key, manifest."""
    if not isinstance(rec, dict):
        return "is not a JSON object"
    missing = [f for f in _FIELDS if f not in rec]
    if missing:
        return f"lacks the fields {missing}"
    kind, side, scorer, rows, passes = (rec[f] for f in ("kind", "side", "scorer", "rows", "passes"))
    if kind not in ("tokens", "draws"):
        return f"has unknown kind {kind!r}"
    if side not in SIDES:
        return f"has unknown side {side!r}"
    if kind == "tokens" and scorer is not None:
        return f"is a tokens marker with scorer {scorer!r}"
    if kind == "draws" and scorer not in spec.scorers:
        return f"names scorer {scorer!r}, not one of the pool's {list(spec.scorers)}"
    if not _is_span(rows, spec.num_per_side):
        return f"claims rows {rows!r}: not a non-empty range within [0, {spec.num_per_side}]"
    if kind == "tokens" and passes is not None:
        return f"is a tokens marker with passes {passes!r}"
    if kind == "draws" and not _is_span(passes, spec.repeats):
        return f"claims passes {passes!r}: not a non-empty range within [0, {spec.repeats}]"
    key = tokens_key(side, *rows) if kind == "tokens" else draws_key(side, scorer, *rows, *passes)
    if rec["key"] != key:
        return f"holds key {rec['key']!r}, but its fields make {key!r}"
    if stem != key:
        return f"holds key {key!r}, not its file name"
    if version < 3:
        return None
    manifest = rec.get("manifest")
    expected = _shard_arrays(spec, kind, side, scorer)
    if not isinstance(manifest, dict) or sorted(manifest) != sorted(expected):
        return f"has no manifest of the arrays {expected} (format version {version} markers carry one)"
    for name in expected:
        shape = [{"rows": list(r), **({} if p is None else {"passes": list(p)})}
                 for r, p in _pieces(spec, rows, passes if kind == "draws" else None)]
        found = manifest[name]
        if (not isinstance(found, list) or len(found) != len(shape)
                or any(not isinstance(piece, dict) or type(piece.get("crc32")) is not int
                       or not 0 <= piece["crc32"] < 2 ** 32 or {k: v for k, v in piece.items() if k != "crc32"} != want
                       for piece, want in zip(found, shape))):
            return f"has a manifest of {name} that does not describe its shard's pieces"
    if kind == "draws":
        scored = rec.get("tokens")
        if not isinstance(scored, dict) or not scored:
            return "names no tokens shards it scored (format version 3 draws markers do)"
        covered = np.zeros(rows[1] - rows[0], bool)
        for tkey, digest in scored.items():
            m = _TOKENS_KEY.match(tkey) if isinstance(tkey, str) else None
            if m is None or m.group(1) != side or not isinstance(digest, str):
                return f"names {tkey!r} among the tokens it scored: not a tokens shard of side {side!r}"
            a, b = max(int(m.group(2)) - rows[0], 0), max(int(m.group(3)) - rows[0], 0)
            covered[a:b] = True
        if not covered.all():
            return f"names tokens shards {sorted(scored)} that do not cover its rows {rows[0]}:{rows[1]}"
    return None


def _read_commits(path: Path, spec: PoolSpec, version: int) -> dict[str, dict]:
    """Every commit marker, validated (see `_marker_problem`; no two shards of one array overlap);
    a bad one raises PoolError naming its file."""
    folder = path / _COMMITS
    if not folder.is_dir():
        raise PoolError(f"{path}: no '{_COMMITS}' folder; not a pool or damaged")
    out = {}
    painted: dict[tuple, np.ndarray] = {}
    for f in sorted(folder.glob("*.json")):
        try:
            rec = json.loads(f.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise PoolError(f"pool {path}: unreadable commit marker {_COMMITS}/{f.name}: {e}") from e
        problem = _marker_problem(rec, f.name[:-len(".json")], spec, version)
        if problem:
            raise PoolError(f"pool {path}: commit marker {_COMMITS}/{f.name} {problem}")
        family = (rec["kind"], rec["side"], rec["scorer"])
        mask = painted.setdefault(family, np.zeros((spec.num_per_side, spec.repeats), bool))
        cells = (slice(*rec["rows"]), slice(None) if rec["passes"] is None else slice(*rec["passes"]))
        if mask[cells].any():
            other = next(k for k, o in out.items() if (o["kind"], o["side"], o["scorer"]) == family
                         and _overlap(o["rows"], rec["rows"]) and (o["passes"] is None or _overlap(o["passes"], rec["passes"])))
            raise PoolError(f"pool {path}: commit marker {_COMMITS}/{f.name} overlaps {_COMMITS}/{other}.json "
                            "(committed regions never overlap)")
        mask[cells] = True
        if version < 3:  # unchecked there: never used
            rec.pop("manifest", None)
            rec.pop("tokens", None)
        out[rec["key"]] = rec
    return out


class PoolWriter:
    """Append-only, shard-atomic writer of one pool. Obtain one with `create_pool` or `open_pool_writer`."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._group = _open_group(self.path, mode="r+")
        self.spec, self.metadata, self._version = _read_header(self._group, self.path)
        if self._version < FORMAT_VERSION:
            warnings.warn(f"pool {self.path} is format version {self._version}: resuming it writes version-"
                          f"{self._version} commit markers too (no manifests: data's places stay unchecked); "
                          "recreate the pool to have them checked", stacklevel=3)
        self._committed = _read_commits(self.path, self.spec, self._version)

    def done_shards(self) -> set[str]:
        """Keys of all committed shards."""
        return set(self._committed)

    def is_done(self, key: str) -> bool:
        """Whether the shard `key` (see `tokens_key` / `draws_key`) is committed."""
        return key in self._committed

    def update_metadata(self, **entries: Any) -> None:
        """Merge JSON-serializable entries into the pool metadata (e.g. finished_at)."""
        meta = dict(self.metadata, **entries)
        _check_json(meta)
        self._group.attrs["metadata"] = meta
        self.metadata = meta

    def write_tokens(self, side: str, row_start: int, tokens, sample_logprobs=None, lengths=None) -> str:
        """Write and commit tokens[a:b] (int [b-a, n]) of `side`, with sample-time log-probs when the
        spec stores them and, in a pool whose outputs stop at EOS, their lengths (int [b-a]; checked
        against the tokens: the first EOS ends a row, the pad fills the rest, a padded sample-time
        log-prob is 0). Returns the shard key. Refuses a block overlapping a committed one."""
        spec = self.spec
        _check_side(side)
        tokens = np.asarray(tokens)
        rows = _span("rows", row_start, tokens.shape[0], spec.num_per_side)
        _check_block("tokens", tokens, (rows[1] - rows[0], spec.n), np.integer)
        if (tokens < 0).any():
            raise PoolError("tokens block holds negative token ids")
        if spec.sample_logprobs != (sample_logprobs is not None):
            raise PoolError(f"spec.sample_logprobs={spec.sample_logprobs} but sample_logprobs "
                            f"{'was not' if sample_logprobs is None else 'was'} given")
        if spec.stops != (lengths is not None):
            raise PoolError(f"this pool's outputs stop at EOS ids {list(spec.eos_ids)}: give the lengths of the rows"
                            if spec.stops else "lengths given, but this pool is fixed-length: create it with "
                            "eos_ids to store outputs that stop at EOS")
        if lengths is not None:
            lengths = np.asarray(lengths)
            _check_block("lengths", lengths, tokens.shape[:1], np.integer)
            check_stopped_tokens(tokens, lengths, spec.eos_ids)
        if sample_logprobs is not None:
            sample_logprobs = np.asarray(sample_logprobs)
            _check_block("sample_logprobs", sample_logprobs, tokens.shape, np.floating)
            if lengths is not None:
                _check_padded_zero("sample_logprobs", sample_logprobs, lengths)
        key = tokens_key(side, *rows)
        self._refuse_overlap(key, "tokens", side, None, rows, None)
        index = (np.arange(*rows), None)
        blocks = {f"tokens/{side}": tokens.astype(np.int32)}
        if lengths is not None:
            blocks[f"lengths/{side}"] = lengths.astype(np.int32)
        if sample_logprobs is not None:
            blocks[f"sample_logprobs/{side}"] = sample_logprobs.astype(np.float32)
        for name, block in blocks.items():
            _write_block(self._group, name, index, block)
        self._commit(key, "tokens", side, None, rows, None, self._marker_body(blocks, rows, None))
        return key

    def write_draws(self, side: str, scorer: str, row_start: int, pass_start: int, logprobs,
                    topk_ids=None, topk_logprobs=None) -> str:
        """Write and commit `scorer`'s draws on `side`: logprobs float [b-a, n, d-c] for rows a:b and
        passes c:d (a = row_start, c = pass_start), plus top-k ids / log-probs [b-a, n, d-c, k] when
        the spec has top_k. Returns the shard key. Refuses a block overlapping a committed one, and
        rows whose tokens are not committed yet (the marker names the tokens shards it scored)."""
        spec = self.spec
        _check_side(side)
        if scorer not in spec.scorers:
            raise PoolError(f"unknown scorer {scorer!r}; the pool has {spec.scorers}")
        logprobs = np.asarray(logprobs)
        if logprobs.ndim != 3:
            raise PoolError(f"logprobs block must be [rows, n, passes], got shape {logprobs.shape}")
        rows = _span("rows", row_start, logprobs.shape[0], spec.num_per_side)
        passes = _span("passes", pass_start, logprobs.shape[2], spec.repeats)
        _check_block("logprobs", logprobs, (rows[1] - rows[0], spec.n, passes[1] - passes[0]), np.floating)
        if np.isnan(logprobs).any():
            raise PoolError("logprobs block contains NaN; a zero-mass draw is -inf, never NaN")
        if (spec.top_k is None) != (topk_ids is None) or (topk_ids is None) != (topk_logprobs is None):
            raise PoolError(f"spec.top_k={spec.top_k}: top-k ids and log-probs must both be "
                            f"{'omitted' if spec.top_k is None else 'given'}")
        if topk_ids is not None:
            topk_ids, topk_logprobs = np.asarray(topk_ids), np.asarray(topk_logprobs)
            _check_block("topk_ids", topk_ids, logprobs.shape + (spec.top_k,), np.integer)
            _check_block("topk_logprobs", topk_logprobs, logprobs.shape + (spec.top_k,), np.floating)
        scored = self._scored_tokens(side, rows) if self._version >= 3 else None
        if spec.stops:
            self._check_padded_draws(side, rows, logprobs, topk_ids, topk_logprobs)
        key = draws_key(side, scorer, *rows, *passes)
        self._refuse_overlap(key, "draws", side, scorer, rows, passes)
        index = (np.arange(*rows), None, np.arange(*passes), None)
        blocks = {f"logprobs/{side}/{scorer}": logprobs.astype(np.float32)}
        if topk_ids is not None:
            blocks[f"topk_ids/{side}/{scorer}"] = topk_ids.astype(np.int32)
            blocks[f"topk_logprobs/{side}/{scorer}"] = topk_logprobs.astype(np.float32)
        for name, block in blocks.items():
            _write_block(self._group, name, index, block)
        body = self._marker_body(blocks, rows, passes)
        if body is not None:
            body["tokens"] = scored
        self._commit(key, "draws", side, scorer, rows, passes, body)
        return key

    def _marker_body(self, blocks, rows, passes) -> dict | None:
        """The manifest of a shard's blocks (None in a version-2 pool, whose markers have none)."""
        return {"manifest": _manifest(self.spec, blocks, rows, passes)} if self._version >= 3 else None

    def _scored_tokens(self, side, rows) -> dict[str, str]:
        """Committed tokens shards of `side` holding rows a:b -> their digests: what draws of those rows
        score. Refuses rows whose tokens are not committed (after re-reading the markers, which another
        writer may have committed since this one opened)."""
        for fresh in (False, True):
            if fresh:
                self._committed = _read_commits(self.path, self.spec, self._version)
            scored, covered = {}, np.zeros(rows[1] - rows[0], bool)
            for key, rec in self._committed.items():
                if rec["kind"] == "tokens" and rec["side"] == side and _overlap(rec["rows"], rows):
                    scored[key] = _digest(rec)
                    covered[max(rec["rows"][0] - rows[0], 0):max(rec["rows"][1] - rows[0], 0)] = True
            if covered.all():
                return scored
        raise PoolError(f"draws of {side} rows {rows[0]}:{rows[1]} before their tokens: draws are bound to the "
                        "tokens they score, so write_tokens comes first")

    def _check_padded_draws(self, side, rows, logprobs, topk_ids, topk_logprobs) -> None:
        """In a stopping pool the rows' tokens come first (their lengths say which positions are
        padding), and every padded draw is the deterministic pad."""
        committed = np.zeros(rows[1] - rows[0], bool)  # from the writer's own commit records: no disk reads
        for rec in self._committed.values():
            if rec["kind"] == "tokens" and rec["side"] == side:
                a, b = max(rec["rows"][0], rows[0]), min(rec["rows"][1], rows[1])
                committed[max(a - rows[0], 0):max(b - rows[0], 0)] = True
        if not committed.all():
            raise PoolError(f"draws of {side} rows {rows[0]}:{rows[1]} before their tokens: in a pool whose outputs "
                            "stop at EOS the lengths (written with the tokens) must come first")
        lengths = _read(_array(self._group, f"lengths/{side}"), (np.arange(*rows),))
        _check_padded_zero("logprobs", logprobs, lengths)
        if topk_ids is not None:
            pad_ids, pad_logprobs = pad_readout(topk_ids.shape[-1], self.spec.eos_ids[0])
            padded = padded_positions(lengths, self.spec.n)
            if (topk_ids[padded][..., 0] != pad_ids[0]).any() or (topk_logprobs[padded] != pad_logprobs).any():
                raise PoolError("top-k readout at a padded position (after EOS) is not the pad alone "
                                "(pools.pad_readout); use pools.pad_stopped on an engine's output")

    def _refuse_overlap(self, key, kind, side, scorer, rows, passes) -> None:
        for other in self._committed.values():
            if other["kind"] != kind or other["side"] != side or other.get("scorer") != scorer:
                continue
            if _overlap(rows, other["rows"]) and (passes is None or _overlap(passes, other["passes"])):
                raise PoolError(f"shard {key} overlaps committed shard {other['key']}; "
                                "committed regions are append-only (check is_done before writing)")

    def _commit(self, key, kind, side, scorer, rows, passes, body=None) -> None:
        rec = {"key": key, "kind": kind, "side": side, "scorer": scorer, "rows": list(rows),
               "passes": None if passes is None else list(passes), "committed_at": _now(), **(body or {})}
        _write_json_atomic(self.path / _COMMITS / f"{key}.json", rec)
        self._committed[key] = rec


def stopped_lengths(tokens, eos_ids) -> np.ndarray:
    """int32 [rows]: real positions of each row of tokens [rows, n], up to and including its first
    EOS id; n for a row without one."""
    tokens = np.asarray(tokens)
    hits = np.isin(tokens, list(eos_ids))
    return np.where(hits.any(-1), hits.argmax(-1) + 1, tokens.shape[-1]).astype(np.int32)


def padded_positions(lengths, n: int) -> np.ndarray:
    """bool [rows, n]: the positions after each row's end."""
    return np.arange(n)[None, :] >= np.asarray(lengths)[:, None]


def pad_readout(width: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids [width], log-probs [width]) of a padded position: the pad with probability 1."""
    logprobs = np.full(width, -np.inf, np.float32)
    logprobs[0] = 0.0
    return np.full(width, pad, np.int32), logprobs


def pad_stopped(lengths, pad: int, logprobs, topk_ids=None, topk_logprobs=None):
    """An engine's per-position arrays ([rows, n, ...]) with every position after a row's end set
    to the deterministic pad: log-prob 0, readout `pad_readout`. Returns new arrays."""
    padded = padded_positions(lengths, np.shape(logprobs)[1])
    logprobs = np.where(padded.reshape(padded.shape + (1,) * (np.ndim(logprobs) - 2)), 0.0, logprobs).astype(np.float32)
    if topk_ids is None:
        return logprobs, None, None
    pad_ids, pad_logprobs = pad_readout(np.shape(topk_ids)[-1], pad)
    mask = padded.reshape(padded.shape + (1,) * (np.ndim(topk_ids) - 2))
    return (logprobs, np.where(mask, pad_ids, topk_ids).astype(np.int32),
            np.where(mask, pad_logprobs, topk_logprobs).astype(np.float32))


def check_stopped_tokens(tokens, lengths, eos_ids) -> None:
    """Refuse rows whose lengths disagree with their tokens (`stopped_lengths`) or whose padding is
    not eos_ids[0]."""
    tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    n = tokens.shape[-1]
    if ((lengths < 1) | (lengths > n)).any():
        raise PoolError(f"lengths must be in [1, {n}], found {lengths.min()}..{lengths.max()}")
    wrong = np.flatnonzero(stopped_lengths(tokens, eos_ids) != lengths)
    if wrong.size:
        raise PoolError(f"rows {wrong[:5].tolist()} (of the block): lengths {lengths[wrong[:5]].tolist()} but their first "
                        f"EOS {list(eos_ids)} gives {stopped_lengths(tokens[wrong[:5]], eos_ids).tolist()}")
    bad = np.flatnonzero((padded_positions(lengths, n) & (tokens != eos_ids[0])).any(-1))
    if bad.size:
        raise PoolError(f"rows {bad[:5].tolist()} (of the block): positions after EOS must hold the pad {eos_ids[0]}")


def _check_padded_zero(name: str, values: np.ndarray, lengths: np.ndarray) -> None:
    padded = padded_positions(lengths, values.shape[1])
    if (values[padded] != 0).any():
        raise PoolError(f"{name} at positions after EOS must be 0 (the pad is deterministic under every model)")


def _check_json(meta: dict) -> None:
    try:
        json.dumps(meta, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise PoolError(f"metadata must be JSON-serializable: {e}") from e


def _overlap(a, b) -> bool:
    return max(a[0], b[0]) < min(a[1], b[1])


def _check_side(side: str) -> None:
    if side not in SIDES:
        raise PoolError(f"side must be one of {SIDES}, got {side!r}")


def _span(what: str, start: int, count: int, total: int) -> tuple[int, int]:
    if start < 0 or count < 1 or start + count > total:
        raise PoolError(f"{what} {start}:{start + count} out of range 0:{total}")
    return int(start), int(start + count)


def _check_block(name: str, block: np.ndarray, shape: tuple, kind) -> None:
    if tuple(block.shape) != tuple(shape):
        raise PoolError(f"{name} block: expected shape {tuple(shape)}, found {tuple(block.shape)}")
    if not np.issubdtype(block.dtype, kind):
        raise PoolError(f"{name} block: expected {kind.__name__} dtype, found {block.dtype}")


def _open_group(path: Path, mode: str):
    if not (path / "zarr.json").is_file():
        raise PoolError(f"{path}: not a pool (no zarr.json)")
    try:
        return zarr.open_group(store=str(path), mode=mode, zarr_format=3)
    except Exception as e:  # zarr raises several types for a damaged store
        raise PoolError(f"{path}: cannot open as a zarr v3 group: {e}") from e


def _read_header(group, path: Path) -> tuple[PoolSpec, dict, int]:
    """(spec, metadata, format version) of an open pool."""
    attrs = group.attrs.asdict()
    version = attrs.get("format_version")
    if version not in _READABLE or type(version) is not int:
        raise PoolError(f"{path}: pool format version {version!r}, this tvjax reads version {FORMAT_VERSION}; "
                        "the format differs (version 2 added chunk checksums, version 3 commit manifests; "
                        "version 2 still loads): recreate the pool")
    if "spec" not in attrs or "metadata" not in attrs:
        raise PoolError(f"{path}: pool attributes lack 'spec' or 'metadata'")
    return _spec_from_json(attrs["spec"]), dict(attrs["metadata"]), version


def _warn_unchecked(path: Path, version: int, stacklevel: int = 3) -> None:
    if version < 3:
        warnings.warn(f"pool {path} is format version {version}: its commit markers hold no manifests, so its data's "
                      "places are unchecked (a chunk copied over another, swapped or renamed arrays load as data); "
                      "recreate the pool with this tvjax to have them checked", stacklevel=stacklevel)


def create_pool(path: str | os.PathLike, *, n: int, num_per_side: int, repeats: int, scorers=("pi", "mu"),
                samplers=None, top_k: int | None = None, sample_logprobs: bool = False,
                metadata: dict | None = None, row_chunk: int | None = None, pass_chunk: int = 1,
                exist_ok: bool = False, eos_ids=()) -> PoolWriter:
    """Create an empty pool at `path` and return its writer.

    metadata: free-form JSON-serializable dict (engine, engine_version, model, dtype, temperature,
    prompt, prompt_token_ids, seeds, batch construction, ...); format_version, created_at and top_k
    are recorded automatically. eos_ids: the EOS ids at which outputs stop (default none: every
    trajectory has n tokens); such a pool stores per-trajectory lengths. With exist_ok=True an
    existing pool with the same spec is reopened for resuming (its metadata is kept); a different
    spec is refused.
    """
    spec = make_spec(n=n, num_per_side=num_per_side, repeats=repeats, scorers=scorers, samplers=samplers,
                     top_k=top_k, sample_logprobs=sample_logprobs, row_chunk=row_chunk, pass_chunk=pass_chunk,
                     eos_ids=eos_ids)
    path = Path(path)
    if path.exists():
        if not exist_ok:
            raise PoolError(f"{path} already exists (pass exist_ok=True to resume it)")
        writer = PoolWriter(path)
        if writer.spec != spec:
            raise PoolError(f"{path}: existing pool spec {writer.spec} differs from requested {spec}")
        return writer
    meta = dict(metadata or {})
    meta.setdefault("created_at", _now())
    meta.setdefault("top_k", spec.top_k)
    meta["format_version"] = FORMAT_VERSION
    _check_json(meta)
    group = zarr.open_group(store=str(path), mode="w-", zarr_format=3)
    for name, (shape, dtype, chunks) in _array_layout(spec).items():
        fill = -1 if dtype == "int32" else float("nan")
        group.create_array(name, shape=shape, dtype=dtype, chunks=chunks, fill_value=fill, compressors=_COMPRESSORS)
    (path / _COMMITS).mkdir()
    # the header goes last: a pool without it is refused, so a crash here leaves no half-pool
    group.attrs.update({"spec": _spec_to_json(spec), "metadata": meta, "format_version": FORMAT_VERSION})
    return PoolWriter(path)


def open_pool_writer(path: str | os.PathLike) -> PoolWriter:
    """Reopen an existing pool for writing (resume)."""
    return PoolWriter(path)


def read_spec(path: str | os.PathLike) -> tuple[PoolSpec, dict]:
    """(spec, metadata) of the pool at `path`, without loading arrays."""
    path = Path(path)
    return _read_header(_open_group(path, mode="r"), path)[:2]


def coverage(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Committed-cell masks: 'tokens/{side}' -> bool [N], 'draws/{side}/{scorer}' -> bool [N, R].
    Raises PoolError naming a commit marker that is unreadable or wrong (see `load_pool`)."""
    path = Path(path)
    spec, _, version = _read_header(_open_group(path, mode="r"), path)
    return _coverage(spec, _read_commits(path, spec, version))


def _coverage(spec: PoolSpec, commits: dict[str, dict]) -> dict[str, np.ndarray]:
    masks = {f"tokens/{s}": np.zeros(spec.num_per_side, bool) for s in SIDES}
    for s in SIDES:
        for sc in spec.scorers:
            masks[f"draws/{s}/{sc}"] = np.zeros((spec.num_per_side, spec.repeats), bool)
    for rec in commits.values():
        (a, b) = rec["rows"]
        if rec["kind"] == "tokens":
            masks[f"tokens/{rec['side']}"][a:b] = True
        else:
            (c, d) = rec["passes"]
            masks[f"draws/{rec['side']}/{rec['scorer']}"][a:b, c:d] = True
    return masks


def read_tokens(path: str | os.PathLike, side: str) -> np.ndarray:
    """The committed tokens [N, n] of `side`, checked against their commit markers; raises PoolError
    unless all N rows are committed and in place."""
    return _read_side(Path(path), side, "tokens")


def read_lengths(path: str | os.PathLike, side: str) -> np.ndarray:
    """The committed lengths [N] of `side` (n throughout a fixed-length pool), checked against their
    commit markers; PoolError unless all N rows are committed (tokens included) and in place."""
    return _read_side(Path(path), side, "lengths")


def _read_side(path: Path, side: str, what: str) -> np.ndarray:
    """All N rows of tokens/{side} or lengths/{side} (the tokens read too: the commit check)."""
    _check_side(side)
    group = _open_group(path, mode="r")
    spec, _, version = _read_header(group, path)
    commits = _read_commits(path, spec, version)
    _warn_unchecked(path, version, stacklevel=4)
    mask = _coverage(spec, commits)[f"tokens/{side}"]
    if not mask.all():
        raise PoolError(f"{path}: tokens of side {side!r} are not all committed ({_missing_message('tokens/' + side, mask)}); "
                        "sample them first")
    rows, layout, places = np.arange(spec.num_per_side), _array_layout(spec), _places(commits)
    names = [f"tokens/{side}"] + ([f"lengths/{side}"] if what == "lengths" and spec.stops else [])
    out = None
    for name in names:
        shape, dtype, _ = layout[name]
        out = _load_array(path, group, name, shape, dtype, rows, None)
        _check_places(path, group, name, out, rows, None, places.get(name, []))
    return out if what == "tokens" or spec.stops else np.full(spec.num_per_side, spec.n, np.int32)


def _ranges(mask: np.ndarray) -> str:
    """'0:3, 7:9' for the True runs of a 1-d bool mask."""
    idx = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return ", ".join(f"{a}:{b}" for a, b in zip(idx[::2], idx[1::2]))


def _missing_message(name: str, mask: np.ndarray) -> str:
    if mask.ndim == 1:
        return f"{name}: rows {_ranges(~mask)} not committed"
    bad_passes = ~mask.all(axis=0)
    bad_rows = ~mask.all(axis=1)
    return f"{name}: rows {_ranges(bad_rows)} x passes {_ranges(bad_passes)} not committed"


def _select(spec: PoolSpec, masks: dict[str, np.ndarray], partial: bool) -> tuple[dict, np.ndarray]:
    """Rows per side and passes to load; raises PoolError listing every incomplete array unless partial."""
    if not partial:
        missing = [_missing_message(k, m) for k, m in masks.items() if not m.all()]
        if missing:
            raise PoolError("incomplete pool: " + "; ".join(missing))
        rows = {s: np.arange(spec.num_per_side) for s in SIDES}
        return rows, np.arange(spec.repeats)
    cells = {s: masks[f"tokens/{s}"][:, None] & np.logical_and.reduce(
        [masks[f"draws/{s}/{sc}"] for sc in spec.scorers]) for s in SIDES}
    # candidate A: rows complete over all passes; candidate B: passes complete over all token rows
    rows_a = {s: np.flatnonzero(cells[s].all(axis=1)) for s in SIDES}
    passes_a = np.arange(spec.repeats)
    rows_b = {s: np.flatnonzero(masks[f"tokens/{s}"]) for s in SIDES}
    passes_b = np.flatnonzero(np.logical_and.reduce([cells[s][rows_b[s]].all(axis=0) for s in SIDES]))
    size_a = sum(len(r) for r in rows_a.values()) * len(passes_a)
    size_b = sum(len(r) for r in rows_b.values()) * len(passes_b)
    rows, passes = (rows_a, passes_a) if size_a >= size_b else (rows_b, passes_b)
    if min(len(r) for r in rows.values()) == 0 or len(passes) == 0:
        raise PoolError("no complete shard to load: every side needs committed tokens and draws of all scorers")
    return rows, passes


def _chunk_grid(arr, index: tuple) -> list[tuple[int, ...]]:
    """Grid coordinates of the chunks of `arr` holding the selected indices (per axis; None = all)."""
    axes = [range(grid) if idx is None else np.unique(idx // size).tolist()
            for idx, size, grid in zip(index, arr.chunks, arr.cdata_shape)]
    return list(itertools.product(*axes))


def _chunk_name(arr, coords: tuple[int, ...]) -> str:
    """'chunk (1, 0, 2) (rows 4:8, passes 2:3)': grid coordinates and the rows / passes they cover."""
    spans = [f"{axis} {c * size}:{min((c + 1) * size, total)}"
             for axis, c, size, total in zip(_AXES, coords, arr.chunks, arr.shape) if axis in ("rows", "passes")]
    return f"chunk {tuple(int(c) for c in coords)} ({', '.join(spans)})"


def _listing(items: list[str], limit: int = 4) -> str:
    """The first `limit` items joined, then a count: a whole damaged array must not make a huge message."""
    more = f"; and {len(items) - limit} more" if len(items) > limit else ""
    return "; ".join(items[:limit]) + more


def _bad_chunks(arr, chunks) -> list[str]:
    """Chunk-by-chunk re-read, the slow path after a failed read: 'chunk ...: error' per unreadable chunk."""
    bad = []
    for coords in chunks:
        try:
            arr.get_block_selection(coords)
        except Exception as e:  # checksum mismatch (ValueError), zstd (RuntimeError), I/O errors
            bad.append(f"{_chunk_name(arr, coords)}: {e}")
    return bad


def _selection(index: tuple) -> tuple:
    """zarr selection of `index` (per axis: sorted indices or None = all), a slice where contiguous."""
    return tuple(slice(None) if idx is None
                 else slice(int(idx[0]), int(idx[-1]) + 1) if idx[-1] - idx[0] + 1 == len(idx) else idx
                 for idx in index)


def _write_block(group, name: str, index: tuple, block: np.ndarray) -> None:
    """Write `block` at the contiguous rows (x passes) of `index` (per axis; None = all; cut to the
    array's rank); a write into part of a damaged chunk is refused."""
    # with empty chunks written too, every chunk of a committed region has a file: a missing one is damage
    with zarr.config.set({"array.write_empty_chunks": True}):
        arr = _array(group, name)
    index = index[:arr.ndim]
    try:
        arr[_selection(index)] = block
    except Exception as e:
        bad = _bad_chunks(arr, _chunk_grid(arr, index))
        if not bad:
            raise
        raise PoolError(f"array {name}: cannot write into damaged {_listing(bad)}") from e


def _flagged_chunks(arr, index: tuple, flags: np.ndarray) -> str:
    """Names of the chunks holding the True cells of `flags` (a mask over the selection `index`)."""
    cells = np.argwhere(flags)
    coords = np.stack([cells[:, a] if idx is None else idx[cells[:, a]] for a, idx in enumerate(index)], axis=1)
    return _listing([_chunk_name(arr, c) for c in np.unique(coords // np.array(arr.chunks), axis=0)])


def _read(arr, index: tuple) -> np.ndarray:
    """The selection `index` of `arr` (see `_selection`), reading only the chunks it meets."""
    sel = _selection(index)
    return arr[sel] if all(isinstance(x, slice) for x in sel) else arr.get_orthogonal_selection(sel)


def _array(group, name: str):
    """The array `name` of an open pool; PoolError when it is missing or its zarr.json is unreadable."""
    try:
        return group[name]
    except Exception as e:  # garbage or wrong entries in its zarr.json: JSON, key, type and value errors
        if not (Path(str(group.store.root)) / name / "zarr.json").is_file():
            raise PoolError(f"array {name} is missing from the pool") from e
        raise PoolError(f"array {name}: unreadable metadata ({name}/zarr.json): {type(e).__name__}: {e}") from e


def _read_checked(arr, name: str, index: tuple, chunks=None) -> np.ndarray:
    """`_read`, with a failed read re-done chunk by chunk to name the damaged chunks."""
    try:
        return _read(arr, index)
    except Exception as e:
        bad = _bad_chunks(arr, _chunk_grid(arr, index) if chunks is None else chunks)
        raise PoolError(f"array {name}: damaged {_listing(bad)}" if bad else f"array {name}: unreadable: {e}") from e


def _places(commits: dict[str, dict]) -> dict[str, list[tuple]]:
    """Array path -> (marker key, rows, passes or None, crc32) of every committed piece (none in a
    version-2 pool)."""
    out: dict[str, list[tuple]] = {}
    for key, rec in commits.items():
        for name, pieces in rec.get("manifest", {}).items():
            out.setdefault(name, []).extend(
                (key, tuple(p["rows"]), tuple(p["passes"]) if "passes" in p else None, p["crc32"]) for p in pieces)
    return out


def _check_places(path: Path, group, name: str, data: np.ndarray, rows: np.ndarray, passes: np.ndarray | None,
                  places: list[tuple]) -> None:
    """Refuse loaded data of `name` (at sorted `rows` x sorted `passes`, None = all) that is not what
    its commit markers wrote there: the crc32 of every committed piece meeting the selection, from the
    data in memory (a piece only partly selected is read whole, from its committed chunk)."""
    bad: dict[str, list[tuple]] = {}
    for key, (a, b), p, crc in places:
        lo, hi = np.searchsorted(rows, (a, b))
        if lo == hi:
            continue
        if p is None or data.ndim < 3:
            whole, block = hi - lo == b - a, data[lo:hi]
        else:
            c, d = (p if passes is None else np.searchsorted(passes, p))
            if c == d:
                continue
            whole, block = hi - lo == b - a and d - c == p[1] - p[0], data[lo:hi, :, c:d]
        if not whole:
            index = (np.arange(a, b), None, None if p is None else np.arange(*p), None)[:data.ndim]
            block = _read_checked(_array(group, name), name, index)
        if _crc(block) != crc:
            bad.setdefault(key, []).append(((a, b), p))
    if bad:
        counts: dict[str, int] = {}
        for key, *_ in places:
            counts[key] = counts.get(key, 0) + 1
        wrong = []
        for key, spans in bad.items():
            if len(spans) == counts[key] > 1:  # the whole shard: its rows (x passes)
                (a, _), (_, b) = spans[0][0], spans[-1][0]
                spans = [((a, b), None if spans[0][1] is None else (spans[0][1][0], spans[-1][1][1]))]
            where = [f"rows {a}:{b}" + ("" if p is None else f" passes {p[0]}:{p[1]}") for (a, b), p in spans]
            wrong.append(f"{', '.join(where[:4])}{f' and {len(where) - 4} more' if len(where) > 4 else ''} "
                         f"do not match their commit marker {_COMMITS}/{key}.json")
        raise PoolError(f"pool {path}: {name} {_listing(wrong)} (data moved or overwritten)")


def _check_scored(path: Path, commits: dict[str, dict], rows: dict, passes: np.ndarray, scorers) -> None:
    """Refuse draws of loaded cells that were scored against other tokens than the committed ones:
    each draws marker names the tokens shards (and their manifests' digests) it scored."""
    digests = {k: _digest(r) for k, r in commits.items() if r["kind"] == "tokens"}
    for key, rec in commits.items():
        if rec["kind"] != "draws" or rec["scorer"] not in scorers or "tokens" not in rec:
            continue
        (a, b), (c, d), sel = rec["rows"], rec["passes"], rows[rec["side"]]
        lo, hi = np.searchsorted(sel, (a, b))
        if lo == hi or not ((passes >= c) & (passes < d)).any():
            continue
        matching = np.zeros(b - a, bool)
        for tkey, digest in rec["tokens"].items():
            if tkey in digests and digests[tkey] != digest:
                raise PoolError(f"pool {path}: draws {rec['side']}/{rec['scorer']} rows {a}:{b} passes {c}:{d} "
                                f"({_COMMITS}/{key}.json) were scored against other tokens than {_COMMITS}/{tkey}.json "
                                "now holds (tokens rewritten or moved)")
            if tkey in digests:
                ta, tb = commits[tkey]["rows"]
                matching[max(ta - a, 0):max(tb - a, 0)] = True
        unmatched = np.zeros(b, bool)
        unmatched[sel[lo:hi]] = ~matching[sel[lo:hi] - a]
        if unmatched.any():
            raise PoolError(f"pool {path}: draws {rec['side']}/{rec['scorer']} rows {a}:{b} passes {c}:{d} "
                            f"({_COMMITS}/{key}.json) were scored against tokens shards {sorted(rec['tokens'])}, but "
                            f"rows {_ranges(unmatched)} are committed by other tokens shards now (tokens rewritten)")


def _load_array(path: Path, group, name: str, shape, dtype: str, rows: np.ndarray, passes: np.ndarray | None):
    arr = _array(group, name)
    if tuple(arr.shape) != tuple(shape) or str(arr.dtype) != dtype:
        raise PoolError(f"array {name}: expected shape {tuple(shape)} {dtype}, found {tuple(arr.shape)} {arr.dtype}")
    if not any(isinstance(c, zarr.codecs.Crc32cCodec) for c in arr.metadata.codecs):
        raise PoolError(f"array {name}: stored without the crc32c checksum codec (not written by this tvjax)")
    index = (rows, None, passes, None)[:len(shape)]
    chunks = _chunk_grid(arr, index)
    # zarr reads a missing chunk file as the fill value, silently: look for the files first
    missing = [_chunk_name(arr, c) for c in chunks if not (path / name / arr.metadata.encode_chunk_key(c)).is_file()]
    if missing:
        fill = "NaN" if dtype == "float32" else "-1"
        raise PoolError(f"array {name}: committed region holds {fill} fill values: chunk file missing for "
                        f"{_listing(missing)}")
    data = _read_checked(arr, name, index, chunks)
    if dtype == "float32" and np.isnan(data).any():
        raise PoolError(f"array {name}: committed region holds NaN in {_flagged_chunks(arr, index, np.isnan(data))}")
    if dtype == "int32" and name.startswith(("tokens", "lengths")) and (data < 0).any():
        raise PoolError(f"array {name}: committed region holds negative values in "
                        f"{_flagged_chunks(arr, index, data < 0)}")
    return data


def load_pool(path: str | os.PathLike, *, partial: bool = False, expect: dict | None = None,
              scorers=None, load_topk: bool = True) -> Pool:
    """Load and validate a pool.

    Raises PoolError (never returns NaN-filled arrays) when the format version is not one this tvjax
    reads, an array is missing or has the wrong shape/dtype or unreadable metadata, a commit marker is
    unreadable or wrong (fields, key, file name, kind/side/scorer, rows/passes within [0, N] / [0, R],
    manifest; message names the marker file), a shard is uncommitted (message lists array, rows and
    passes), a chunk of the loaded cells is missing or damaged or holds NaN (message names the array
    and the chunk: grid coordinates, rows, passes), loaded data is not what its commit marker wrote
    there (crc32 per piece: a chunk copied over another, swapped or renamed arrays; message names the
    array, rows, passes and marker), draws were scored against other tokens than the committed ones,
    or `expect` (a dict of metadata entries) does not match. Only the chunks of the loaded cells are
    read (and, in a partial load, the rest of a committed chunk it meets, to check it whole). A
    format-2 pool loads with a warning: its markers hold no manifests, so places are unchecked.
    partial=True loads only committed cells: the larger of (rows complete over all passes) and
    (all token rows x passes complete on them); `Pool.rows` / `Pool.passes` say what was loaded.
    scorers: subset of scorers to load (default all); load_topk=False skips the top-k arrays.
    """
    path = Path(path)
    group = _open_group(path, mode="r")
    spec, meta, version = _read_header(group, path)
    if expect:
        wrong = {k: (v, meta.get(k, "<absent>")) for k, v in expect.items() if meta.get(k, "<absent>") != v}
        if wrong:
            raise PoolError(f"{path}: metadata mismatch (key: expected vs found): "
                            + "; ".join(f"{k}: {e!r} vs {f!r}" for k, (e, f) in wrong.items()))
    scorers = spec.scorers if scorers is None else tuple(scorers)
    unknown = [s for s in scorers if s not in spec.scorers]
    if unknown:
        raise PoolError(f"{path}: unknown scorers {unknown}; the pool has {spec.scorers}")
    commits = _read_commits(path, spec, version)
    _warn_unchecked(path, version)
    masks = {k: m for k, m in _coverage(spec, commits).items()
             if k.startswith("tokens") or k.split("/")[2] in scorers}
    rows, passes = _select(spec._replace(scorers=scorers), masks, partial)
    _check_scored(path, commits, rows, passes, scorers)
    layout, places = _array_layout(spec), _places(commits)

    def get(name, side, with_passes=False):
        shape, dtype, _ = layout[name]
        data = _load_array(path, group, name, shape, dtype, rows[side], passes if with_passes else None)
        _check_places(path, group, name, data, rows[side], passes if with_passes else None, places.get(name, []))
        return data

    tokens = {s: get(f"tokens/{s}", s) for s in SIDES}
    lengths = {s: get(f"lengths/{s}", s) if spec.stops else np.full(len(rows[s]), spec.n, np.int32) for s in SIDES}
    slp = {s: get(f"sample_logprobs/{s}", s) for s in SIDES} if spec.sample_logprobs else None
    lps = {s: {sc: get(f"logprobs/{s}/{sc}", s, True) for sc in scorers} for s in SIDES}
    with_topk = spec.top_k is not None and load_topk
    ids = {s: {sc: get(f"topk_ids/{s}/{sc}", s, True) for sc in scorers} for s in SIDES} if with_topk else None
    tlp = {s: {sc: get(f"topk_logprobs/{s}/{sc}", s, True) for sc in scorers} for s in SIDES} if with_topk else None
    return Pool(spec._replace(scorers=scorers), meta, tokens, slp, lps, ids, tlp, rows, passes, lengths)
