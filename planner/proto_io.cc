#include "planner/proto_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"

namespace zplan {
namespace {

// Collects text-format parse errors with their line and column.
class TextErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty()) first_ = absl::StrCat("line ", line + 1, ", column ", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

std::string TemporaryPath(absl::string_view path) { return absl::StrCat(path, ".tmp.", getpid()); }

}  // namespace

ProtoFormat FormatForPath(absl::string_view path) {
  if (absl::EndsWith(path, ".textproto") || absl::EndsWith(path, ".txtpb") ||
      absl::EndsWith(path, ".pbtxt")) {
    return ProtoFormat::kText;
  }
  if (absl::EndsWith(path, ".json")) return ProtoFormat::kJson;
  return ProtoFormat::kBinary;
}

absl::StatusOr<std::string> SerializeProto(const google::protobuf::Message& message,
                                           ProtoFormat format) {
  std::string out;
  switch (format) {
    case ProtoFormat::kBinary:
      if (!message.SerializeToString(&out)) {
        return absl::InternalError(absl::StrCat("cannot serialise ", message.GetTypeName()));
      }
      return out;
    case ProtoFormat::kText:
      if (!google::protobuf::TextFormat::PrintToString(message, &out)) {
        return absl::InternalError(absl::StrCat("cannot print ", message.GetTypeName()));
      }
      return out;
    case ProtoFormat::kJson: {
      google::protobuf::util::JsonPrintOptions options;
      options.add_whitespace = true;
      options.preserve_proto_field_names = true;
      options.always_print_primitive_fields = true;
      auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
      if (!status.ok()) return absl::InternalError(status.message().ToString());
      return out;
    }
  }
  return absl::InternalError("unknown proto format");
}

absl::Status ParseProto(absl::string_view data, ProtoFormat format, absl::string_view what,
                        google::protobuf::Message* message) {
  switch (format) {
    case ProtoFormat::kBinary: {
      // The rejection below says it in one line; protobuf would also log a
      // string that is not UTF-8.
      google::protobuf::LogSilencer silencer;
      if (!message->ParseFromArray(data.data(), static_cast<int>(data.size()))) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": not a binary ", message->GetTypeName(),
            " (corrupt or truncated; regenerate it with zplan --out)"));
      }
      return absl::OkStatus();
    }
    case ProtoFormat::kText: {
      TextErrorCollector errors;
      google::protobuf::TextFormat::Parser parser;
      parser.RecordErrorsTo(&errors);
      if (!parser.ParseFromString(std::string(data), message)) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": ", errors.first()));
      }
      return absl::OkStatus();
    }
    case ProtoFormat::kJson: {
      google::protobuf::util::JsonParseOptions options;
      auto status = google::protobuf::util::JsonStringToMessage(std::string(data), message, options);
      if (!status.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": ", status.message().ToString()));
      }
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unknown proto format");
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is a directory; give a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    if (error == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::PermissionDeniedError(absl::StrCat(path, ": ", std::strerror(error)));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return contents.str();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view data) {
  const std::string tmp = TemporaryPath(path);
  FILE* file = std::fopen(tmp.c_str(), "wb");
  if (file == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  const bool written = std::fwrite(data.data(), 1, data.size(), file) == data.size();
  const bool flushed = std::fflush(file) == 0 && fsync(fileno(file)) == 0;
  const bool closed = std::fclose(file) == 0;
  if (!written || !flushed || !closed) {
    std::remove(tmp.c_str());
    return absl::DataLossError(absl::StrCat("cannot write ", path, " (disk full?); it was left unchanged"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(tmp.c_str());
    return absl::PermissionDeniedError(absl::StrCat("cannot replace ", path, ": ", std::strerror(error)));
  }
  return absl::OkStatus();
}

absl::Status CheckWritable(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is a directory; give a file name"));
  }
  const std::string tmp = TemporaryPath(path);
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) {
    const int error = errno;
    const std::string message = absl::StrCat("cannot write ", path, ": ", std::strerror(error));
    return error == ENOENT ? absl::NotFoundError(message) : absl::PermissionDeniedError(message);
  }
  close(fd);
  unlink(tmp.c_str());
  return absl::OkStatus();
}

absl::Status ReadProtoFile(const std::string& path, google::protobuf::Message* message) {
  auto data = ReadFile(path);
  if (!data.ok()) return data.status();
  return ParseProto(*data, FormatForPath(path), path, message);
}

absl::Status WriteProtoFile(const std::string& path, const google::protobuf::Message& message) {
  auto data = SerializeProto(message, FormatForPath(path));
  if (!data.ok()) return data.status();
  // Read it back first: a file that would not parse (a string that is not
  // UTF-8) or parse as something else must never replace a good one.
  std::unique_ptr<google::protobuf::Message> back(message.New());
  const absl::Status parsed = ParseProto(*data, FormatForPath(path), path, back.get());
  if (!parsed.ok() || !google::protobuf::util::MessageDifferencer::Equals(message, *back)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": the ", message.GetTypeName(),
                                                   " would not read back as written (",
                                                   parsed.ok() ? "it differs" : parsed.message(),
                                                   "); nothing was written"));
  }
  return WriteFileAtomically(path, *data);
}

}  // namespace zplan
