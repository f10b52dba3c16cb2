#!/usr/bin/env bash
# Sourced by the GPU scripts (bench/gpu_answer_eval.sh, bench/gpu.sh serve): install_modules
# BUNDLE TARGET puts what the device's python lacks from BUNDLE (scripts/eval_bundle.py; its
# MANIFEST says which modules and when) into TARGET, once per bundle. The caller defines PY
# (the python command line, an array) and fail (prints its message and exits).

install_modules() {
  local BUNDLE=$1 target=$2 module when item
  if [ -f "$target/.manifest" ] && [ "$(cat "$BUNDLE/MANIFEST")" = "$(cat "$target/.manifest")" ]; then
    echo "modules: installed earlier in $target"
  else
    rm -rf "$target" && mkdir -p "$target" || fail "cannot create $target"
    wheels=() dirs=() had=()
    while read -r module when item; do
      [ -n "$module" ] || continue
      if [ "$when" = missing ] && (cd / && env -u PYTHONPATH "${PY[@]}" -c "import $module" >/dev/null 2>&1); then
        had+=("$module")
      elif [ -d "$BUNDLE/$item" ]; then
        dirs+=("$BUNDLE/$item")
      else
        wheels+=("$BUNDLE/$item")
      fi
    done <"$BUNDLE/MANIFEST"
    if [ ${#wheels[@]} -gt 0 ]; then
      if "${PY[@]}" -m pip --version >/dev/null 2>&1; then
        PIP_ROOT_USER_ACTION=ignore "${PY[@]}" -m pip install --quiet --no-deps --no-index --no-compile --disable-pip-version-check \
          --target "$target" "${wheels[@]}" || fail "pip install into $target failed"
      else # a wheel is a zip of its files and .dist-info, laid out as installed
        "${PY[@]}" -c 'import sys, zipfile
for w in sys.argv[2:]: zipfile.ZipFile(w).extractall(sys.argv[1])' "$target" "${wheels[@]}" ||
          fail "unpacking the wheels into $target failed"
      fi
    fi
    for d in ${dirs[@]+"${dirs[@]}"}; do cp -r "$d"/. "$target/" || fail "cannot copy $d into $target"; done
    cp "$BUNDLE/MANIFEST" "$target/.manifest"
    echo "modules: installed into $target: ${wheels[*]##*/} ${dirs[*]##*/}; the device had: ${had[*]:-none}"
  fi
}
