#pragma once
// A checkpoint's files on disk, around the safetensors file save_checkpoint
// writes (atomically: a temporary file renamed over the last one):
// - its completion marker, PATH.complete, written after the rename: the
//   step, the byte count and the CRC-32 of the file. A reader that finds the
//   marker naming the file's size and checksum knows the file is whole, also
//   on file systems whose rename is not atomic or when a copy was cut short.
// - the history --keep-checkpoints N keeps: PATH is the newest; before it is
//   replaced, the one it holds stays as STEM.step<N><EXT> (a hard link), and
//   the oldest beyond N are removed. A save interrupted at any point leaves
//   the newest complete checkpoint on disk with its marker (N >= 2).
// - --resume auto: the newest complete one among PATH and its history.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/io/checkpoint.h"

namespace mix::io {

struct CheckpointFile {
  std::string path;
  int64_t step = 0;
};

/// PATH.complete.
std::string completion_marker_path(const std::string& checkpoint);

/// Writes the marker of the whole file `checkpoint` (whose bytes `digest`
/// describes, as write_safetensors returned it), saved after `step` steps.
void write_completion_marker(const std::string& checkpoint, int64_t step, const FileDigest& digest);

/// The step `checkpoint`'s marker names, when the marker exists and names
/// the file's size and CRC-32; otherwise nullopt and `why` says what is wrong.
std::optional<int64_t> complete_step(const std::string& checkpoint, std::string* why = nullptr);

/// The history files of `path` (STEM.step<N><EXT> beside it), oldest first;
/// their completeness is not checked.
std::vector<CheckpointFile> checkpoint_history(const std::string& path);

/// Before a new checkpoint replaces `path`, with `keep` checkpoints to keep:
/// links the complete one `path` holds into the history, then removes the
/// oldest history files (and their markers) beyond keep - 1. Nothing when keep <= 1.
void keep_previous_checkpoint(const std::string& path, int64_t keep);

/// --save: keep_previous_checkpoint, then save_checkpoint (meta must hold the
/// step) and the new file's completion marker.
void save_checkpoint_keeping(const std::string& path, const Program& p, const Scope& scope, const Metadata& meta,
                             int64_t step, int64_t keep);

/// --resume auto: the newest complete checkpoint among `path` and its
/// history, or nullopt when there is none. The files are checked newest
/// first (by their markers' steps) and the search stops at the first whole
/// one. `skipped`: each file passed over, with the reason.
std::optional<CheckpointFile> newest_complete_checkpoint(const std::string& path, std::vector<std::string>* skipped);

}  // namespace mix::io
