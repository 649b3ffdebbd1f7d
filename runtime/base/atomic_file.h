// Atomic whole-file writes: a temporary beside the target, fsync, rename.
// A crash at any moment leaves either the old file or the new one, never half.
#ifndef MT_RUNTIME_ATOMIC_FILE_H
#define MT_RUNTIME_ATOMIC_FILE_H

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace mt::rt {

// Returns "" on success, else a one-line reason naming the path.
std::string write_file_atomically(const std::string &path, std::string_view bytes);

// Writes all n bytes to fd (retrying interrupted and partial writes, at most
// 1 GiB per call); false with errno set on failure.
bool write_all(int fd, const void *data, size_t n);

// The same for a file made of several pieces written in order, so that large
// arrays need not be copied into one buffer first.
std::string write_pieces_atomically(const std::string &path,
                                    const std::vector<std::string_view> &pieces);

// mkdir -p with mode 0755. True when `dir` exists as a directory afterwards;
// else false with *failed the path that could not be made (or that exists
// and is not a directory, *error_number then ENOTDIR) and *error_number the
// reason, for the caller to word its own message.
bool make_directories(const std::string &dir, std::string *failed, int *error_number);

} // namespace mt::rt

#endif // MT_RUNTIME_ATOMIC_FILE_H
