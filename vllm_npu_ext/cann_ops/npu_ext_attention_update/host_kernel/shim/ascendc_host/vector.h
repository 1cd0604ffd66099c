/**
 * The vector instructions the kernel calls, in their "tensor前n个数据计算" (first `count`
 * elements) form, on the host. Each follows its documented formula (AscendC Memory矢量计算:
 * Add/Sub/Div/Max, Adds/Maxs, Exp/Ln, Axpy "dst = scalar * src + dst", Duplicate, Cast) in
 * fp32 with one rounding per operation (the library is compiled with -ffp-contract=off), and
 * enforces what the API documents for every operand:
 *   - a LocalTensor from a TQue/TBuf, the first `count` elements inside its buffer, the start
 *     32-byte aligned ("通用地址对齐约束": Unified Buffer 32Byte对齐);
 *   - source and destination either disjoint or the very same range ("通用地址重叠约束":
 *     "源操作数与目的操作数必须100%完全重叠，不支持部分重叠"; Cast between element sizes: disjoint);
 *   - the vector unit may use the buffer now (VECIN after DeQue, VECOUT before EnQue);
 *   - count 0 is a no-op (Atlas A2/A3), a negative count an error.
 * The count form splits into 256-byte repeats inside the library, so the repeat-count and
 * stride limits of the repeat form never bind here. Arithmetic is modelled for fp32 only;
 * Cast for fp16/bf16 <-> fp32 with the round modes Atlas A2 lists for those pairs.
 */
#ifndef ASCENDC_HOST_VECTOR_H
#define ASCENDC_HOST_VECTOR_H

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "ascendc_host/runtime.h"
#include "ascendc_host/tensor.h"
#include "ascendc_host/types.h"

namespace AscendC {

enum class RoundMode : uint8_t {
    CAST_NONE = 0,  // no rounding when exact, CAST_RINT when the conversion loses precision
    CAST_RINT,      // round to nearest, ties to even
    CAST_FLOOR,
    CAST_CEIL,
    CAST_ROUND,
    CAST_TRUNC,
    CAST_ODD,
};

}  // namespace AscendC

namespace ascendc_host {

/** One operand of a vector instruction: its host address and its UB byte range. */
struct Operand {
    uint8_t *data;
    uint32_t begin;
    uint32_t end;
};

template <typename T>
Operand VectorOperand(const char *api, const AscendC::LocalTensor<T> &tensor, uint64_t count)
{
    uint8_t *data = tensor.Access(api, 0, count, Unit::kVector);
    const uint32_t begin = tensor.UbOffset();
    return Operand{data, begin, begin + static_cast<uint32_t>(count * sizeof(T))};
}

inline void CheckOverlap(const char *api, const Operand &dst, const Operand &src, bool sameSize)
{
    const bool disjoint = dst.end <= src.begin || src.end <= dst.begin;
    const bool identical = sameSize && dst.begin == src.begin && dst.end == src.end;
    if (!disjoint && !identical) {
        Fail(api, "source UB [" + std::to_string(src.begin) + ", " + std::to_string(src.end) +
                      ") partly overlaps destination [" + std::to_string(dst.begin) + ", " +
                      std::to_string(dst.end) + ")");
    }
}

inline uint64_t CheckedCount(const char *api, int64_t count)
{
    if (count < 0) {
        Fail(api, "negative count " + std::to_string(count));
    }
    return static_cast<uint64_t>(count);
}

template <typename T>
void RequireFloat()
{
    static_assert(std::is_same<T, float>::value, "the host shim models fp32 vector arithmetic");
}

/** dst[i] = op(src0[i], src1[i]) over the first `count` elements, after the operand checks. */
template <typename T, typename Op>
void Binary(const char *api, const AscendC::LocalTensor<T> &dst,
            const AscendC::LocalTensor<T> &src0, const AscendC::LocalTensor<T> &src1,
            int64_t count, Op op)
{
    RequireFloat<T>();
    const uint64_t n = CheckedCount(api, count);
    if (n == 0) {
        return;
    }
    const Operand out = VectorOperand(api, dst, n);
    const Operand in0 = VectorOperand(api, src0, n);
    const Operand in1 = VectorOperand(api, src1, n);
    CheckOverlap(api, out, in0, true);
    CheckOverlap(api, out, in1, true);
    auto *y = reinterpret_cast<float *>(out.data);
    const auto *a = reinterpret_cast<const float *>(in0.data);
    const auto *b = reinterpret_cast<const float *>(in1.data);
    for (uint64_t i = 0; i < n; ++i) {
        y[i] = op(a[i], b[i]);
    }
}

template <typename T, typename Op>
void Unary(const char *api, const AscendC::LocalTensor<T> &dst, const AscendC::LocalTensor<T> &src,
           int64_t count, Op op)
{
    Binary(api, dst, src, src, count, [op](float x, float) { return op(x); });
}

inline float MaxOf(float a, float b) { return a > b ? a : b; }

}  // namespace ascendc_host

namespace AscendC {

template <typename T>
__aicore__ inline void Add(const LocalTensor<T> &dst, const LocalTensor<T> &src0,
                           const LocalTensor<T> &src1, const int32_t &count)
{
    ascendc_host::Binary("Add", dst, src0, src1, count, [](float a, float b) { return a + b; });
}

template <typename T>
__aicore__ inline void Sub(const LocalTensor<T> &dst, const LocalTensor<T> &src0,
                           const LocalTensor<T> &src1, const int32_t &count)
{
    ascendc_host::Binary("Sub", dst, src0, src1, count, [](float a, float b) { return a - b; });
}

template <typename T>
__aicore__ inline void Div(const LocalTensor<T> &dst, const LocalTensor<T> &src0,
                           const LocalTensor<T> &src1, const int32_t &count)
{
    ascendc_host::Binary("Div", dst, src0, src1, count, [](float a, float b) { return a / b; });
}

template <typename T>
__aicore__ inline void Max(const LocalTensor<T> &dst, const LocalTensor<T> &src0,
                           const LocalTensor<T> &src1, const int32_t &count)
{
    ascendc_host::Binary("Max", dst, src0, src1, count, ascendc_host::MaxOf);
}

template <typename T>
__aicore__ inline void Adds(const LocalTensor<T> &dst, const LocalTensor<T> &src,
                            const T &scalarValue, const int32_t &count)
{
    const float s = scalarValue;
    ascendc_host::Unary("Adds", dst, src, count, [s](float x) { return x + s; });
}

template <typename T>
__aicore__ inline void Maxs(const LocalTensor<T> &dst, const LocalTensor<T> &src,
                            const T &scalarValue, const int32_t &count)
{
    const float s = scalarValue;
    ascendc_host::Unary("Maxs", dst, src, count,
                        [s](float x) { return ascendc_host::MaxOf(x, s); });
}

template <typename T>
__aicore__ inline void Exp(const LocalTensor<T> &dst, const LocalTensor<T> &src,
                           const int32_t &count)
{
    ascendc_host::Unary("Exp", dst, src, count, [](float x) { return std::exp(x); });
}

template <typename T>
__aicore__ inline void Ln(const LocalTensor<T> &dst, const LocalTensor<T> &src,
                          const int32_t &count)
{
    ascendc_host::Unary("Ln", dst, src, count, [](float x) { return std::log(x); });
}

/** dst = scalar * src + dst; scalarValue has src's type (fp32 only here). */
template <typename T, typename U>
__aicore__ inline void Axpy(const LocalTensor<T> &dst, const LocalTensor<U> &src,
                            const U &scalarValue, const int32_t &count)
{
    static_assert(std::is_same<T, U>::value, "the host shim models fp32 Axpy only");
    const float s = scalarValue;
    // dst is read as well as written: the second source is dst itself.
    ascendc_host::Binary("Axpy", dst, src, dst, count, [s](float x, float y) {
        const float product = s * x;
        return product + y;
    });
}

template <typename T>
__aicore__ inline void Duplicate(const LocalTensor<T> &dst, const T &scalarValue,
                                 const int32_t &count)
{
    const uint64_t n = ascendc_host::CheckedCount("Duplicate", count);
    if (n == 0) {
        return;
    }
    uint8_t *out = ascendc_host::VectorOperand("Duplicate", dst, n).data;
    for (uint64_t i = 0; i < n; ++i) {
        std::memcpy(out + i * sizeof(T), &scalarValue, sizeof(T));
    }
}

/**
 * Cast between fp32 and fp16/bf16: widening is exact (CAST_NONE, the only mode Atlas A2 lists
 * for half->float and bfloat16_t->float); narrowing rounds to nearest even (CAST_RINT, or
 * CAST_NONE for float->half, which then means CAST_RINT; float->bfloat16_t has no CAST_NONE).
 * The other narrowing modes are legal on the device but not modelled: they fail here.
 */
template <typename T1, typename T2>
__aicore__ inline void Cast(const LocalTensor<T1> &dst, const LocalTensor<T2> &src,
                            const RoundMode &roundMode, const uint32_t count)
{
    constexpr bool kWiden = std::is_same<T1, float>::value && !std::is_same<T2, float>::value;
    constexpr bool kNarrow = std::is_same<T2, float>::value && !std::is_same<T1, float>::value;
    static_assert(kWiden || kNarrow, "the host shim models fp16/bf16 <-> fp32 Cast only");
    const bool allowed = kWiden ? roundMode == RoundMode::CAST_NONE
                                : roundMode == RoundMode::CAST_RINT ||
                                      (std::is_same<T1, half>::value &&
                                       roundMode == RoundMode::CAST_NONE);
    if (!allowed) {
        ascendc_host::Fail("Cast", "round mode " + std::to_string(static_cast<int>(roundMode)) +
                                       " is not a documented (and modelled) mode for this pair");
    }
    if (count == 0) {
        return;
    }
    const ascendc_host::Operand out = ascendc_host::VectorOperand("Cast", dst, count);
    const ascendc_host::Operand in = ascendc_host::VectorOperand("Cast", src, count);
    ascendc_host::CheckOverlap("Cast", out, in, false);
    for (uint32_t i = 0; i < count; ++i) {
        T2 value;
        std::memcpy(&value, in.data + i * sizeof(T2), sizeof(T2));
        const T1 result = ascendc_host::FromFloatRint<T1>(ascendc_host::ToFloat(value));
        std::memcpy(out.data + i * sizeof(T1), &result, sizeof(T1));
    }
}

}  // namespace AscendC

#endif  // ASCENDC_HOST_VECTOR_H
