// File: proto_io.h
// Reading and writing protobuf messages as files, binary or text format.
//
// Writes are atomic: the message goes to "<path>.tmp.<pid>" and is renamed
// over <path> only once complete, so a failed or interrupted write never
// replaces a good file. Reads return kNotFound for a missing file and
// kInvalidArgument (naming the file) for content that does not parse.
//
// The format follows the extension: ".textproto", ".txtpb" and ".pbtxt" are
// text format, ".json" is JSON with the proto field names, anything else
// (".pb") is binary.
//
// Example:
//   ZPLAN_RETURN_IF_ERROR(WriteProtoFile("plan.pb", plan));
//   ZPLAN_ASSIGN_OR_RETURN(Plan loaded, ReadProtoFile<Plan>("plan.pb"));
#ifndef ZPLAN_PLANNER_PROTO_IO_H_
#define ZPLAN_PLANNER_PROTO_IO_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace zplan {

enum class ProtoFormat { kBinary, kText, kJson };

ProtoFormat FormatForPath(absl::string_view path);

// Serialises `message` in `format`. JSON keeps the proto field names and
// prints fields with default values, so every breakdown row is visible.
absl::StatusOr<std::string> SerializeProto(const google::protobuf::Message& message,
                                           ProtoFormat format);

absl::Status ParseProto(absl::string_view data, ProtoFormat format, absl::string_view what,
                        google::protobuf::Message* message);

// Reads the whole file; kNotFound / kPermissionDenied name the path,
// kInvalidArgument a directory.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes `data` to `path` through a temporary file and rename(2).
absl::Status WriteFileAtomically(const std::string& path, absl::string_view data);

// Whether WriteFileAtomically(path, ...) can succeed now, checked before
// any work (planning, training) so a bad path fails first: the temporary
// file it would use is created and removed. kInvalidArgument for a
// directory, kNotFound or kPermissionDenied naming the path otherwise.
absl::Status CheckWritable(const std::string& path);

absl::Status ReadProtoFile(const std::string& path, google::protobuf::Message* message);
absl::Status WriteProtoFile(const std::string& path, const google::protobuf::Message& message);

template <typename T>
absl::StatusOr<T> ReadProtoFile(const std::string& path) {
  T message;
  absl::Status status = ReadProtoFile(path, &message);
  if (!status.ok()) return status;
  return message;
}

}  // namespace zplan

#endif  // ZPLAN_PLANNER_PROTO_IO_H_
