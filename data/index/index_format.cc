// The index file's layout: building it in memory, and checking a file image before any use.
#include "data/index/index_format.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "data/image/image_codec.h"

namespace stoker {

static_assert(kIndexedJpeg == static_cast<uint8_t>(ImageEncoding::kJpeg) &&
                  kIndexedPng == static_cast<uint8_t>(ImageEncoding::kPng),
              "IndexedSample::encoding holds ImageEncoding values");

namespace {

constexpr uint64_t RoundUp8(uint64_t n) { return (n + 7) / 8 * 8; }

uint32_t BodyCrc(const uint8_t* bytes, uint64_t length) {
  const uint64_t begin = sizeof(IndexFileHeader);
  return static_cast<uint32_t>(
      crc32_z(crc32_z(0, nullptr, 0), bytes + begin, static_cast<size_t>(length - begin)));
}

absl::Status Corrupt(const std::string& what, absl::string_view detail) {
  return absl::DataLossError(
      absl::StrCat(what, ": corrupt sample index: ", detail, " (rebuild it from the dataset)"));
}

}  // namespace

IndexLayout ComputeIndexLayout(uint64_t sample_count, uint64_t source_count,
                               uint64_t class_name_count, uint64_t strings_bytes) {
  IndexLayout layout;
  layout.samples = sizeof(IndexFileHeader);
  layout.sources = layout.samples + sample_count * sizeof(IndexedSample);
  layout.class_names = layout.sources + source_count * sizeof(SourceRecord);
  layout.strings = RoundUp8(layout.class_names + class_name_count * sizeof(uint32_t));
  layout.end = layout.strings + strings_bytes;
  return layout;
}

uint8_t EncodingForExtension(absl::string_view extension) {
  if (absl::EqualsIgnoreCase(extension, "jpg") || absl::EqualsIgnoreCase(extension, "jpeg")) {
    return kIndexedJpeg;
  }
  if (absl::EqualsIgnoreCase(extension, "png")) return kIndexedPng;
  return 0;
}

uint8_t ImageEncodingOfName(absl::string_view name) {
  if (absl::EndsWithIgnoreCase(name, ".jpg") || absl::EndsWithIgnoreCase(name, ".jpeg")) {
    return kIndexedJpeg;
  }
  if (absl::EndsWithIgnoreCase(name, ".png")) return kIndexedPng;
  return 0;
}

IndexBuilder::IndexBuilder(bool sharded) : sharded_(sharded) {}

absl::StatusOr<uint32_t> IndexBuilder::AddString(absl::string_view text) {
  if (text.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("name \"", absl::CHexEscape(text), "\" contains a NUL byte"));
  }
  if (strings_.size() + text.size() + 1 > kMaxIndexStringBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the dataset's file and member names exceed ",
                                                   kMaxIndexStringBytes, " bytes in all (at \"",
                                                   absl::CHexEscape(text), "\")"));
  }
  const uint32_t offset = static_cast<uint32_t>(strings_.size());
  strings_.append(text.data(), text.size());
  strings_.push_back('\0');
  return offset;
}

void IndexBuilder::AddSource(uint32_t path, uint64_t file_bytes) {
  SourceRecord record{};
  record.file_bytes = file_bytes;
  record.first_sample = samples_.size();
  record.path = path;
  sources_.push_back(record);
}

absl::Status IndexBuilder::AddSample(const IndexedSample& sample) {
  if (static_cast<int64_t>(samples_.size()) >= kMaxIndexSamples) {
    return absl::InvalidArgumentError(
        absl::StrCat("more than ", kMaxIndexSamples, " samples: too many for one index"));
  }
  samples_.push_back(sample);
  max_label_ = std::max(max_label_, int{sample.label});
  sample_bytes_ += sample.size;
  return absl::OkStatus();
}

absl::Status IndexBuilder::SetRoot(absl::string_view real_root) {
  absl::StatusOr<uint32_t> offset = AddString(real_root);
  if (!offset.ok()) return offset.status();
  root_ = *offset;
  return absl::OkStatus();
}

absl::StatusOr<SampleIndex> IndexBuilder::Finish(int classes, const std::string& what) {
  if (samples_.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": no samples"));
  if (classes == 0) classes = max_label_ + 1;
  if (strings_.empty()) strings_.push_back('\0');
  IndexFileHeader header{};
  std::memcpy(header.magic, kIndexMagic, sizeof(header.magic));
  header.version = kIndexVersion;
  header.kind = sharded_ ? kIndexKindShards : kIndexKindImageFolder;
  header.sample_count = samples_.size();
  header.source_count = static_cast<uint32_t>(sources_.size());
  header.classes = static_cast<uint32_t>(classes);
  header.class_name_count = static_cast<uint32_t>(class_names_.size());
  header.strings_bytes = strings_.size();
  header.skipped = static_cast<uint64_t>(skipped_);
  header.outside = static_cast<uint64_t>(outside_);
  header.root_set = root_.has_value() ? 1 : 0;
  header.root = root_.value_or(0);
  header.sample_record_bytes = sizeof(IndexedSample);
  header.source_record_bytes = sizeof(SourceRecord);
  const IndexLayout layout = ComputeIndexLayout(header.sample_count, header.source_count,
                                                header.class_name_count, header.strings_bytes);
  header.file_bytes = layout.end;

  std::vector<uint64_t> words((layout.end + 7) / 8, 0);
  uint8_t* bytes = reinterpret_cast<uint8_t*>(words.data());
  std::memcpy(bytes + layout.samples, samples_.data(), samples_.size() * sizeof(IndexedSample));
  std::memcpy(bytes + layout.sources, sources_.data(), sources_.size() * sizeof(SourceRecord));
  if (!class_names_.empty()) {  // (memcpy from a null data() is undefined even for 0 bytes)
    std::memcpy(bytes + layout.class_names, class_names_.data(),
                class_names_.size() * sizeof(uint32_t));
  }
  std::memcpy(bytes + layout.strings, strings_.data(), strings_.size());
  std::memcpy(bytes, &header, sizeof(header));  // the CRC covers the body only
  header.body_crc32 = BodyCrc(bytes, layout.end);
  std::memcpy(bytes, &header, sizeof(header));
  return SampleIndexAccess::FromOwned(std::move(words), layout.end, what);
}

absl::Status ValidateIndexBytes(const uint8_t* bytes, uint64_t length, const std::string& what) {
  if (length < sizeof(IndexFileHeader)) {
    return Corrupt(what, absl::StrFormat("truncated: %d bytes, shorter than the %d-byte header",
                                         length, sizeof(IndexFileHeader)));
  }
  IndexFileHeader h;
  std::memcpy(&h, bytes, sizeof(h));
  if (std::memcmp(h.magic, kIndexMagic, sizeof(kIndexMagic)) != 0) {
    return absl::DataLossError(absl::StrFormat(
        "%s: not a sample index: magic \"%s\" at byte offset 0, expected \"STKINDEX\"", what,
        absl::CHexEscape(absl::string_view(h.magic, sizeof(h.magic)))));
  }
  if (h.version != kIndexVersion) {
    return absl::DataLossError(absl::StrFormat(
        "%s: sample index version %d at byte offset 8; this program reads version %d (rebuild "
        "the index)",
        what, h.version, kIndexVersion));
  }
  if (h.kind != kIndexKindImageFolder && h.kind != kIndexKindShards) {
    return Corrupt(what, absl::StrFormat("kind %d at byte offset 12", h.kind));
  }
  if (h.sample_record_bytes != sizeof(IndexedSample) ||
      h.source_record_bytes != sizeof(SourceRecord)) {
    return Corrupt(
        what, absl::StrFormat("record sizes %d and %d, expected %d and %d", h.sample_record_bytes,
                              h.source_record_bytes, sizeof(IndexedSample), sizeof(SourceRecord)));
  }
  if (h.file_bytes != length) {
    return Corrupt(what, absl::StrFormat("the header gives %d bytes, the file has %d (truncated "
                                         "or extended)",
                                         h.file_bytes, length));
  }
  const bool sharded = h.kind == kIndexKindShards;
  if (h.sample_count < 1 || h.sample_count > static_cast<uint64_t>(kMaxIndexSamples) ||
      h.source_count < 1 || h.classes < 1 || h.classes > kMaxIndexClasses ||
      h.class_name_count != (sharded ? 0 : h.classes) || h.strings_bytes < 1 ||
      h.strings_bytes > kMaxIndexStringBytes || (!sharded && h.source_count != h.sample_count)) {
    return Corrupt(what, absl::StrFormat("impossible counts in the header: %d samples, %d sources, "
                                         "%d classes, %d class names, %d string bytes",
                                         h.sample_count, h.source_count, h.classes,
                                         h.class_name_count, h.strings_bytes));
  }
  const IndexLayout layout =
      ComputeIndexLayout(h.sample_count, h.source_count, h.class_name_count, h.strings_bytes);
  if (layout.end != length) {
    return Corrupt(
        what, absl::StrFormat("its counts need %d bytes, the file has %d", layout.end, length));
  }
  if (const uint32_t crc = BodyCrc(bytes, length); crc != h.body_crc32) {
    return Corrupt(what, absl::StrFormat("CRC-32 0x%08x of bytes [%d, %d) differs from the "
                                         "header's 0x%08x",
                                         crc, sizeof(IndexFileHeader), length, h.body_crc32));
  }
  const char* strings = reinterpret_cast<const char*>(bytes + layout.strings);
  if (strings[h.strings_bytes - 1] != '\0') {
    return Corrupt(what, absl::StrFormat("the string table does not end in NUL (byte offset %d)",
                                         layout.end - 1));
  }
  auto name_ok = [&](uint32_t offset) { return offset < h.strings_bytes && strings[offset] != 0; };
  if (h.root_set > 1 || (h.root_set == 1 && (!name_ok(h.root) || strings[h.root] != '/'))) {
    return Corrupt(what, absl::StrFormat("confinement root %d at string offset %d", h.root_set,
                                         h.root));
  }

  const auto* sources = reinterpret_cast<const SourceRecord*>(bytes + layout.sources);
  for (uint32_t s = 0; s < h.source_count; ++s) {
    const SourceRecord& source = sources[s];
    const uint64_t at = layout.sources + uint64_t{s} * sizeof(SourceRecord);
    const uint64_t previous = s == 0 ? 0 : sources[s - 1].first_sample;
    if (!name_ok(source.path)) {
      return Corrupt(what, absl::StrFormat("source %d (byte offset %d): path at string offset %d",
                                           s, at, source.path));
    }
    if ((s == 0 && source.first_sample != 0) || source.first_sample < previous ||
        source.first_sample > h.sample_count || (!sharded && source.first_sample != s)) {
      return Corrupt(what, absl::StrFormat("source %d (byte offset %d): first sample %d", s, at,
                                           source.first_sample));
    }
  }
  const auto* class_names = reinterpret_cast<const uint32_t*>(bytes + layout.class_names);
  for (uint32_t c = 0; c < h.class_name_count; ++c) {
    if (!name_ok(class_names[c])) {
      return Corrupt(what, absl::StrFormat("class %d (byte offset %d): name at string offset %d", c,
                                           layout.class_names + 4 * uint64_t{c}, class_names[c]));
    }
  }
  const auto* samples = reinterpret_cast<const IndexedSample*>(bytes + layout.samples);
  for (uint64_t i = 0; i < h.sample_count; ++i) {
    const IndexedSample& sample = samples[i];
    const uint64_t at = layout.samples + i * sizeof(IndexedSample);
    if (sample.source >= h.source_count) {
      return Corrupt(what, absl::StrFormat("sample %d (byte offset %d): source %d of %d", i, at,
                                           sample.source, h.source_count));
    }
    const SourceRecord& source = sources[sample.source];
    const uint64_t end = sample.source + 1 < h.source_count
                             ? sources[sample.source + 1].first_sample
                             : h.sample_count;
    if (i < source.first_sample || i >= end) {
      return Corrupt(what, absl::StrFormat("sample %d (byte offset %d): source %d holds samples "
                                           "[%d, %d)",
                                           i, at, sample.source, source.first_sample, end));
    }
    if (!name_ok(sample.name) || sample.label >= h.classes ||
        (sample.encoding != kIndexedJpeg && sample.encoding != kIndexedPng) ||
        sample.reserved[0] != 0 || sample.reserved[1] != 0) {
      return Corrupt(what,
                     absl::StrFormat("sample %d (byte offset %d): name at %d, label %d of "
                                     "%d classes, encoding %d",
                                     i, at, sample.name, sample.label, h.classes, sample.encoding));
    }
    if (sample.offset > source.file_bytes || sample.size > source.file_bytes - sample.offset) {
      return Corrupt(what, absl::StrFormat("sample %d (byte offset %d): bytes [%d, %d) beyond "
                                           "the %d bytes of source %d",
                                           i, at, sample.offset, sample.offset + sample.size,
                                           source.file_bytes, sample.source));
    }
  }
  return absl::OkStatus();
}

}  // namespace stoker
