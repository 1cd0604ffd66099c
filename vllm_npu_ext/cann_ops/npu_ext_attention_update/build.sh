#!/usr/bin/env bash
# Build and install the NpuExtAttentionUpdate custom operator package (needs CANN), or run
# its host-side tests (needs only g++ and python3).
#
#   ./build.sh                          build for ascend910b and ascend910_93, install to
#                                       vllm_npu_ext/cann_ops/_opp (the package's default)
#   ./build.sh --install-path=/opt/opp  install elsewhere: <path>/vendors/vllm_npu_ext
#   ./build.sh --soc=ascend910b         one SoC only (ascend910b, ascend910_93 or all)
#   ./build.sh --no-install             build the .run package only
#   ./build.sh --host-tests             g++ tiling sweep + host build of the kernel; no CANN
set -euo pipefail

OP_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENDOR_NAME="vllm_npu_ext"                 # vllm_npu_ext.cann_ops.VENDOR_NAME
DEFAULT_INSTALL_PATH="${OP_DIR}/../_opp"   # vllm_npu_ext.cann_ops.DEFAULT_INSTALL_PATH
ALL_SOCS="ascend910b;ascend910_93"

install_path="${DEFAULT_INSTALL_PATH}"
socs="${ALL_SOCS}"
build_dir="${OP_DIR}/build"
jobs="$(nproc 2>/dev/null || echo 4)"
do_install=1

die() { echo "build.sh: $*" >&2; exit 1; }

usage() { sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

for arg in "$@"; do
    case "${arg}" in
        --install-path=*) install_path="${arg#*=}" ;;
        --soc=all) socs="${ALL_SOCS}" ;;
        --soc=ascend910b|--soc=ascend910_93) socs="${arg#*=}" ;;
        --build-dir=*) build_dir="${arg#*=}" ;;
        --jobs=*) jobs="${arg#*=}" ;;
        --no-install) do_install=0 ;;
        --host-tests) cd "${OP_DIR}/../../.." &&
            exec python3 -m vllm_npu_ext.cann_ops.npu_ext_attention_update.tests.host_build ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option ${arg} (see --help)" ;;
    esac
done

cann="${ASCEND_HOME_PATH:-${ASCEND_TOOLKIT_HOME:-}}"
[[ -n "${cann}" && -d "${cann}" ]] ||
    die "CANN not found: source <CANN>/set_env.sh first" \
        "(e.g. /usr/local/Ascend/ascend-toolkit/set_env.sh)"
command -v cmake >/dev/null || die "cmake (>= 3.16) is required"

echo "build.sh: CANN ${cann}; SoCs ${socs}; vendor ${VENDOR_NAME}; build dir ${build_dir}"
cmake -S "${OP_DIR}" -B "${build_dir}" \
    -DASCEND_CANN_PACKAGE_PATH="${cann}" \
    -DASCEND_COMPUTE_UNIT="${socs}" \
    -Dvendor_name="${VENDOR_NAME}" \
    -DCMAKE_BUILD_TYPE=Release
cmake --build "${build_dir}" --target binary package -j "${jobs}"

shopt -s nullglob
installers=("${build_dir}"/custom_opp_*.run)
shopt -u nullglob
(( ${#installers[@]} == 1 )) ||
    die "expected one custom_opp_*.run in ${build_dir}, found ${#installers[@]}"
echo "build.sh: package ${installers[0]}"
(( do_install )) || exit 0

mkdir -p "${install_path}"
install_path="$(cd "${install_path}" && pwd)"
vendor_dir="${install_path}/vendors/${VENDOR_NAME}"
# With --install-path a new version is installed after removing the old one (CANN's rule).
if [[ -f "${vendor_dir}/scripts/uninstall.sh" ]]; then
    bash "${vendor_dir}/scripts/uninstall.sh"
fi
bash "${installers[0]}" --install-path="${install_path}"

missing=()
for soc in ${socs//;/ }; do
    config="${vendor_dir}/op_impl/ai_core/tbe/config/${soc}/aic-${soc}-ops-info.json"
    [[ -f "${config}" ]] || missing+=("${config}")
done
for file in op_api/lib/libcust_opapi.so bin/set_env.bash; do
    [[ -e "${vendor_dir}/${file}" ]] || missing+=("${vendor_dir}/${file}")
done
(( ${#missing[@]} == 0 )) || die "installed package lacks: ${missing[*]}"

echo "build.sh: installed ${vendor_dir}"
echo "build.sh: to use it: source ${vendor_dir}/bin/set_env.bash"
