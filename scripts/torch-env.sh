# Sourced (`. scripts/torch-env.sh`): puts the libraries of python3's torch (torch/lib and the nvidia wheels' lib
# folders beside it) first on LD_LIBRARY_PATH, for an rn50 built elsewhere against the same torch release
# (scripts/gpu-bundle.sh ships it as env.sh; benches/cuda_graph_check.sh sources it). PY overrides python3.
_rn50_site=$("${PY:-python3}" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
_rn50_libs=$_rn50_site/torch/lib
for _rn50_d in "$_rn50_site"/nvidia/*/lib "$_rn50_site"/nvidia/*/*/lib; do
    [ -d "$_rn50_d" ] && _rn50_libs=$_rn50_libs:$_rn50_d
done
export LD_LIBRARY_PATH=$_rn50_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "libtorch from $_rn50_site/torch"
unset _rn50_site _rn50_libs _rn50_d
