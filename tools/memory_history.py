"""The CUDA caching allocator's recorded history as text, in docs/gpu_traces/README.md's format,
so that planner/caching_allocator_test can replay a real run's requests through the model of the
allocator without a GPU, and say which request mapped each segment.

  python3 tools/memory_history.py SNAPSHOT.pickle OUT.tsv.gz [--title TEXT]
      converts a pickled snapshot (zrun --memory_snapshot_dir) taken with the history on

From a process that trains on the GPU (tools/deepspeed_oracle.py --memory-history):
  start()                  records every allocator action from here on, with Python frames
  mark_step(device)        a 512 B allocation per step start, written as '# step N' in the file
  write(path, title)       the snapshot's history, gzip text

Each event line is: time_us action size addr stream frame. `frame` (an extra column the replay
ignores) is the innermost Python frame outside torch's own files that made an allocation or
mapped a segment, as file:line:function, or '-'.
"""
import argparse
import gzip
import os
import pickle
import sys

_KEPT_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free")
_MARKER_BLOCK_BYTES = 512  # the small pool's smallest block: a step marker changes nothing else


def start():
    import torch
    torch.cuda.memory._record_memory_history("all", context="alloc", stacks="python", max_entries=8_000_000)


def mark_step(device):
    """An allocation this module's name identifies in the history, freed at once."""
    import torch
    torch.empty(_MARKER_BLOCK_BYTES, dtype=torch.uint8, device=device)


def _frame(entry):
    for f in entry.get("frames") or []:
        name = f.get("filename", "")
        if name.startswith("<") or f"{os.sep}torch{os.sep}" in name:
            continue
        return f"{os.path.basename(name)}:{f.get('line', 0)}:{f.get('name', '?')}"
    return "-"


def tsv_lines(snapshot, title, device_index=0):
    """The history file's lines: settings and the segments at the end as '#' lines, then one
    line per action, with a '# step N' line before each step marker's allocation."""
    lines = [f"# caching allocator history of one process: {title}",
             "# segments and their blocks are the state at the end; segments with no segment_alloc below "
             "existed before the history began.",
             f"# allocator_settings {snapshot.get('allocator_settings', {})}"]
    streams = {0: 0}  # CUDA stream handles as 0 (the default stream), 1, 2, ... in segments and events alike

    def stream_id(handle):
        return streams.setdefault(handle, len(streams))

    for seg in sorted(snapshot.get("segments", []), key=lambda s: s["address"]):
        if seg.get("device", device_index) != device_index:
            continue
        lines.append(f"# segment address={seg['address']} total_size={seg['total_size']} "
                     f"stream={stream_id(seg.get('stream', 0))} "
                     f"type={seg.get('segment_type', 'large')}")
        for block in seg.get("blocks", []):
            lines.append(f"#   block address={block['address']} size={block['size']} state={block['state']}")
    lines.append("time_us\taction\tsize\taddr\tstream\tframe")
    traces = snapshot.get("device_traces", [])
    entries = [e for e in (traces[device_index] if device_index < len(traces) else [])
               if e.get("action") in _KEPT_ACTIONS]
    t0 = entries[0].get("time_us", 0) if entries else 0
    step = 0
    for e in entries:
        stream = stream_id(e.get("stream", 0))
        frame = _frame(e) if e["action"] in ("alloc", "segment_alloc") else "-"
        if e["action"] == "alloc" and frame.endswith(":mark_step") and e["size"] == _MARKER_BLOCK_BYTES:
            lines.append(f"# step {step}")
            step += 1
        lines.append(f"{e.get('time_us', 0) - t0}\t{e['action']}\t{e['size']}\t{e['addr']}\t{stream}\t{frame}")
    return lines


def write(path, title, snapshot=None):
    """Writes the history (gzip text) through a temporary file and a rename."""
    if snapshot is None:
        import torch
        snapshot = torch.cuda.memory._snapshot()
    tmp = f"{path}.tmp{os.getpid()}"
    with gzip.open(tmp, "wt") as f:
        f.write("\n".join(tsv_lines(snapshot, title)) + "\n")
    os.replace(tmp, path)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("snapshot", help="a pickled torch.cuda.memory snapshot")
    p.add_argument("out", help="the history, gzip text")
    p.add_argument("--title", default="", help="what ran (the first line)")
    args = p.parse_args(argv)
    try:
        with open(args.snapshot, "rb") as f:
            snapshot = pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError) as e:
        sys.exit(f"memory_history: {args.snapshot}: not a readable snapshot ({e})")
    if not isinstance(snapshot, dict) or "segments" not in snapshot:
        sys.exit(f"memory_history: {args.snapshot}: no 'segments'; pass torch.cuda.memory._snapshot()'s pickle")
    write(args.out, args.title or os.path.basename(args.snapshot), snapshot)


if __name__ == "__main__":
    main(sys.argv[1:])
