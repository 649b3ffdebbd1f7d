// Atomic whole-file writes: a temporary beside the target, fsync, rename.
// A crash at any moment leaves either the old file or the new one, never half.
#ifndef MT_RUNTIME_ATOMIC_FILE_H
#define MT_RUNTIME_ATOMIC_FILE_H

#include <string>
#include <string_view>

namespace mt::rt {

// Returns "" on success, else a one-line reason naming the path.
std::string write_file_atomically(const std::string &path, std::string_view bytes);

} // namespace mt::rt

#endif // MT_RUNTIME_ATOMIC_FILE_H
