"""Split a large file (a GGUF) into pieces small enough for one device call, and print the
commands that put it back together on the device machine.

One call to the device machine carries at most 64 MiB (the working tree included), but files
written outside the repository copy there (under /root/stage) stay while the machine is warm.
So the file goes over one piece per call, each appended to the file on the device, and the
sha256 of the whole is checked at the end (../shared/GPU.md, "Moving files larger than one
call allows").

    python scripts/split_gguf.py /work/models/qwen2.5-coder-0.5b-q4_k_m.gguf
    python scripts/split_gguf.py MODEL.gguf --out .out/pieces --piece-mib 56 \
        --stage /root/stage/model.gguf

Writes, in --out (git-ignored: .out/ is in .gitignore):
    <stem>.partNN      the pieces, in order, each at most --piece-mib MiB
    <stem>.sha256      "<sha256>  <stage path>", for `sha256sum -c` on the device
    <stem>.pieces.json the source's name, size and sha256, each piece's offset, size, sha256
and prints, for each piece, the `carry` path and the command of its call. Each command
appends its piece only when the staged file has exactly the bytes of the pieces before it
(and does nothing when it already holds this piece), so a call repeated after a lost
answer does no harm, and one out of order fails with a clear line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
from pathlib import Path

MIB = 1 << 20
MAX_PIECE_MIB = 60  # a call carries 64 MiB in all; the working tree needs a few of them
CALL_MIB = 64  # what one device call carries: the working tree and the piece
MARGIN_MIB = 1  # room for files added before the calls
READ_CHUNK = 4 * MIB


def tree_bytes(root: Path) -> int | None:
    """The bytes of the working tree a device call carries (tracked files, and untracked
    ones git does not ignore), or None outside a git checkout."""
    import subprocess

    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, check=False,
    )  # fmt: skip
    if listed.returncode != 0:
        return None
    paths = [root / name for name in listed.stdout.decode().split("\0") if name]
    return sum(p.stat().st_size for p in paths if p.is_file())


def auto_piece_mib(root: Path) -> float:
    """The largest piece that fits one call beside the working tree at `root`."""
    tree = tree_bytes(root) or 0
    return min(MAX_PIECE_MIB, int(CALL_MIB - MARGIN_MIB - tree / MIB))


def split(src: Path, out: Path, piece_bytes: int) -> dict:
    """Write the pieces and the checksum files; return the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{src.stem}.part*"):
        old.unlink()
    whole = hashlib.sha256()
    pieces, offset, index = [], 0, 0
    with open(src, "rb") as f:
        while True:
            name = f"{src.stem}.part{index:02d}"
            piece_hash, size = hashlib.sha256(), 0
            with open(out / name, "wb") as p:
                while size < piece_bytes:
                    chunk = f.read(min(READ_CHUNK, piece_bytes - size))
                    if not chunk:
                        break
                    p.write(chunk)
                    whole.update(chunk)
                    piece_hash.update(chunk)
                    size += len(chunk)
            if size == 0:
                (out / name).unlink()
                break
            pieces.append(
                {"name": name, "offset": offset, "size": size, "sha256": piece_hash.hexdigest()}
            )
            offset += size
            index += 1
    return {"source": src.name, "size": offset, "sha256": whole.hexdigest(), "pieces": pieces}


def device_command(carry: str, piece: dict, stage: str) -> str:
    """The shell command of one piece's call: append it after exactly the bytes before it."""
    start, end = piece["offset"], piece["offset"] + piece["size"]
    q, d = shlex.quote(stage), shlex.quote(str(Path(stage).parent))
    return (
        f"mkdir -p {d} && touch {q} && n=$(stat -c %s {q}) && "
        f'if [ "$n" -ge {end} ]; then echo "{piece["name"]} already there"; '
        f'elif [ "$n" = {start} ]; then cat {shlex.quote(carry)} >> {q}; '
        f'else echo "{stage} has $n bytes, expected {start} before {piece["name"]}" >&2; exit 1; fi'
        f" && stat -c '%s bytes' {q}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="the file to split (a .gguf)")
    ap.add_argument("--out", type=Path, default=Path(".out/pieces"), help="(git-ignored)")
    ap.add_argument("--piece-mib", type=float, default=None,
                    help=f"piece size in MiB, at most {MAX_PIECE_MIB} (default: what a 64 MiB "
                    "call leaves beside this checkout's working tree, less 1 MiB)")  # fmt: skip
    ap.add_argument("--stage", default="/root/stage/model.gguf",
                    help="where the device assembles the file (outside the repository copy)")  # fmt: skip
    args = ap.parse_args(argv)
    if not args.src.is_file():
        print(f"split_gguf: no such file: {args.src}", file=sys.stderr)
        return 2
    if args.piece_mib is None:
        args.piece_mib = auto_piece_mib(Path.cwd())
    if not 0 < args.piece_mib <= MAX_PIECE_MIB:
        print(f"split_gguf: --piece-mib must be in (0, {MAX_PIECE_MIB}]", file=sys.stderr)
        return 2
    if not args.stage.startswith("/"):
        print("split_gguf: --stage must be an absolute path on the device", file=sys.stderr)
        return 2
    try:
        manifest = split(args.src, args.out, int(args.piece_mib * MIB))
    except OSError as e:
        print(f"split_gguf: {e.strerror or e}: {e.filename or args.out}", file=sys.stderr)
        return 1
    stem = args.src.stem
    (args.out / f"{stem}.sha256").write_text(f"{manifest['sha256']}  {args.stage}\n")
    manifest["stage"] = args.stage
    (args.out / f"{stem}.pieces.json").write_text(json.dumps(manifest, indent=1) + "\n")
    n = len(manifest["pieces"])
    print(f"{args.src}: {manifest['size']:,} bytes, sha256 {manifest['sha256']}")
    print(f"{n} pieces of at most {args.piece_mib:g} MiB in {args.out}; one device call each, "
          "back to back:\n")  # fmt: skip
    for i, piece in enumerate(manifest["pieces"]):
        carry = (args.out / piece["name"]).as_posix()
        print(f"# call {i + 1}/{n}: carry [{carry!r}]  ({piece['size'] / MIB:.1f} MiB)")
        print(device_command(carry, piece, args.stage) + "\n")
    print("# then, in the same lease (the last call may do it too):")
    print(f"echo {shlex.quote(manifest['sha256'] + '  ' + args.stage)} | sha256sum -c")
    return 0


if __name__ == "__main__":
    sys.exit(main())
