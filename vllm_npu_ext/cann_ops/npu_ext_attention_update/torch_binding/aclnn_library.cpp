/**
 * Run-time lookup of the NpuExtAttentionUpdate aclnn functions and aclTensor wrapping.
 */
#include "aclnn_library.h"

#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace npu_ext_cann {
namespace {

constexpr const char *kLibraryName = "libcust_opapi.so";
constexpr const char *kGetWorkspaceSizeSymbol = "aclnnNpuExtAttentionUpdateGetWorkspaceSize";
constexpr const char *kRunSymbol = "aclnnNpuExtAttentionUpdate";

std::vector<std::string> CustomOppEntries()
{
    std::vector<std::string> entries;
    const char *value = std::getenv("ASCEND_CUSTOM_OPP_PATH");
    std::stringstream stream(value == nullptr ? "" : value);
    std::string entry;
    while (std::getline(stream, entry, ':')) {
        if (!entry.empty()) {
            entries.push_back(entry);
        }
    }
    return entries;
}

/** Both symbols from one library, or an empty API. The handle is kept for the process. */
AttentionUpdateApi TryLibrary(const std::string &path)
{
    AttentionUpdateApi api;
    void *handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL);
    if (handle == nullptr) {
        return api;
    }
    api.getWorkspaceSize = reinterpret_cast<decltype(api.getWorkspaceSize)>(
        dlsym(handle, kGetWorkspaceSizeSymbol));
    api.run = reinterpret_cast<decltype(api.run)>(dlsym(handle, kRunSymbol));
    if (api.getWorkspaceSize == nullptr || api.run == nullptr) {
        dlclose(handle);
        return AttentionUpdateApi{};
    }
    return api;
}

AttentionUpdateApi FindApi()
{
    std::string searched;
    for (const std::string &entry : CustomOppEntries()) {
        const std::string path = entry + "/op_api/lib/" + kLibraryName;
        const AttentionUpdateApi api = TryLibrary(path);
        if (api.run != nullptr) {
            return api;
        }
        searched += "\n  " + path;
    }
    TORCH_CHECK(false, kRunSymbol, " was not found in any ", kLibraryName,
                " on ASCEND_CUSTOM_OPP_PATH; searched:", searched.empty() ? " (none)" : searched,
                "\nBuild and install vllm_npu_ext/cann_ops/npu_ext_attention_update (build.sh) "
                "and source <install-path>/vendors/vllm_npu_ext/bin/set_env.bash.");
    return AttentionUpdateApi{};
}

aclDataType AclDataType(const at::Tensor &tensor)
{
    switch (tensor.scalar_type()) {
        case at::kFloat:
            return ACL_FLOAT;
        case at::kHalf:
            return ACL_FLOAT16;
        case at::kBFloat16:
            return ACL_BF16;
        default:
            TORCH_CHECK(false, "npu_ext_attention_update: unsupported dtype ",
                        tensor.scalar_type());
    }
    return ACL_DT_UNDEFINED;
}

}  // namespace

const AttentionUpdateApi &LoadAttentionUpdateApi()
{
    static const AttentionUpdateApi api = FindApi();
    return api;
}

void AclTensorDeleter::operator()(aclTensor *tensor) const
{
    aclDestroyTensor(tensor);
}

AclTensorPtr ToAclTensor(const at::Tensor &tensor)
{
    if (!tensor.defined()) {
        return AclTensorPtr();
    }
    // The storage is described as one flat run of elements; sizes/strides/offset are the view.
    const int64_t storageElements =
        static_cast<int64_t>(tensor.storage().nbytes() / tensor.itemsize());
    aclTensor *handle = aclCreateTensor(
        tensor.sizes().data(), tensor.dim(), AclDataType(tensor), tensor.strides().data(),
        tensor.storage_offset(), ACL_FORMAT_ND, &storageElements, 1,
        const_cast<void *>(tensor.storage().data()));
    TORCH_CHECK(handle != nullptr, "aclCreateTensor failed");
    return AclTensorPtr(handle);
}

}  // namespace npu_ext_cann
