/**
 * Host stand-in for CANN's register/tilingdata_base.h (TilingData结构定义/注册): a TilingData
 * class is its fields in declaration order, with set_<field>/get_<field>, SaveToBuffer and
 * GetDataSize. The same class is the kernel side's tiling struct: GET_TILING_DATA reads the
 * saved bytes back as REGISTER_TILING_DATA_CLASS's class (one registered class per build).
 */
#ifndef REGISTER_TILINGDATA_BASE_H
#define REGISTER_TILINGDATA_BASE_H

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "ascendc_host/graph.h"

namespace ascendc_host {

inline void SaveTilingBytes(const void *fields, size_t bytes, void *data, size_t capacity)
{
    if (data == nullptr || bytes > capacity) {
        throw std::length_error("TilingData::SaveToBuffer: tiling buffer too small");
    }
    std::memcpy(data, fields, bytes);
}

}  // namespace ascendc_host

#define BEGIN_TILING_DATA_DEF(class_name) \
    class class_name {                    \
    public:
#define TILING_DATA_FIELD_DEF(data_type, field_name)                   \
    data_type field_name = 0;                                          \
    void set_##field_name(data_type value) { field_name = value; }     \
    data_type get_##field_name() const { return field_name; }
#define END_TILING_DATA_DEF                                                     \
    void SaveToBuffer(void *data, size_t capacity) const                        \
    {                                                                           \
        ::ascendc_host::SaveTilingBytes(this, sizeof(*this), data, capacity);   \
    }                                                                           \
    size_t GetDataSize() const { return sizeof(*this); }                        \
    }
#define REGISTER_TILING_DATA_CLASS(op_type, class_name) using DefaultTilingData = class_name;

#endif  // REGISTER_TILINGDATA_BASE_H
