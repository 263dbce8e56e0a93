#include "engine/model_config.h"

#include "common/enum_names.h"

namespace stoker {

const char* PrecisionName(Precision precision) {
  static constexpr const char* kNames[] = {"fp32", "bf16", "fp16"};
  return EnumName(precision, kNames);
}

}  // namespace stoker
