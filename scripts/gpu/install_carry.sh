# shellcheck shell=bash
# Install the carried wheels (.gpucarry/wheels, built here by `python3 scripts/gpu/build_carry.py`) on a lent GPU
# machine, which reaches no registry. First lines of every GPU command (carry: [".gpucarry"]):
#
#     source scripts/gpu/install_carry.sh || exit 1
#
# - installs .gpucarry/wheels/*.whl into /tmp/site (GPUCARRY_SITE overrides) with
#   `python3 -m pip install --no-index --no-deps --no-compile --no-cache-dir --upgrade --target` and its bytecode
#   compiled on all cores (compileall -j 0), once per machine
#   session: a stamp in the site holds the wheels' checksum, so a warm machine skips the install until the folder
#   changes (a rebuilt plugin wheel changes it);
# - prepends /tmp/site to PYTHONPATH and /tmp/site/bin to PATH (exported, so the server's subprocesses see them);
# - checks that sglang 0.5.23, sglang_glm_ext, xxhash >= 4.1.0 (not the image's 4.0.1) and lmdb import from there and
#   that the plugin's entry point is visible; prints one line of versions, or one line saying what is missing and
#   returns non-zero.
# Entry points: SGLang finds plugins through importlib.metadata.entry_points(group="sglang.srt.plugins"), which scans
# every sys.path entry for *.dist-info. `pip install --target` keeps sglang_glm_ext-<v>.dist-info/entry_points.txt
# in /tmp/site, so with /tmp/site on PYTHONPATH the entry point is discovered like a site-packages install (checked
# below, and on the CPU by build_carry's dry run).
# Not set here (the command decides): SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python (required with the image's
# torch 2.11, see docs/research), SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 (no sglang-kernel on the image).

_gpucarry_install() {
    local repo site wheels stamp sum py
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd) || return 1
    site=${GPUCARRY_SITE:-/tmp/site}
    wheels=$repo/.gpucarry/wheels
    py=${GPUCARRY_PYTHON:-python3}
    if ! compgen -G "$wheels/*.whl" >/dev/null; then
        echo "install_carry: FAIL: no wheels in $wheels (build them here with 'python3 scripts/gpu/build_carry.py' and name .gpucarry in carry)" >&2
        return 1
    fi
    sum=$(cat "$wheels"/*.whl | cksum) || return 1
    stamp=$site/.gpucarry-stamp
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ]; then
        echo "install_carry: wheels already installed in $site"
    else
        # A site this script filled earlier with other wheels is cleared, so no stale package survives.
        [ -f "$stamp" ] && rm -rf "$site"
        mkdir -p "$site" || return 1
        local t0=$SECONDS log
        log=$(mktemp)
        if ! PIP_ROOT_USER_ACTION=ignore "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --disable-pip-version-check --target "$site" "$wheels"/*.whl >"$log" 2>&1; then
            echo "install_carry: FAIL: pip install --target $site failed: $(grep -v '^\s*$' "$log" | tail -n 3 | tr '\n' ' ')" >&2
            rm -f "$log"
            return 1
        fi
        rm -f "$log"
        # Bytecode once, on every core: each server process imports SGLang (and its ~200 model modules) from
        # source otherwise, 3 processes a server, several servers at once (~45 s a start seen on the H200).
        local t1=$SECONDS
        "$py" -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
        echo "$sum" >"$stamp"
        echo "install_carry: installed $(ls "$wheels"/*.whl | wc -l) wheels into $site in $((t1 - t0)) s, bytecode in $((SECONDS - t1)) s"
    fi
    case ":${PYTHONPATH:-}:" in
        *":$site:"*) ;;
        *) export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" ;;
    esac
    case ":$PATH:" in
        *":$site/bin:"*) ;;
        *) export PATH="$site/bin:$PATH" ;;
    esac
    GPUCARRY_SITE=$site GPUCARRY_REPO=$repo "$py" - <<'EOF'
import importlib, importlib.metadata as md, os, sys

site = os.path.realpath(os.environ["GPUCARRY_SITE"])
problems, versions, origins = [], {}, []
for mod, dist, want in (("sglang", "sglang", "0.5.23"), ("sglang_glm_ext", "sglang-glm-ext", None),
                        ("xxhash", "xxhash", None), ("lmdb", "lmdb", None)):
    try:
        m = importlib.import_module(mod)
    except Exception as exc:  # noqa: BLE001 - report any import failure by name
        problems.append(f"{mod} does not import ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
        continue
    where = os.path.realpath(getattr(m, "__file__", "") or "")
    # Run from the repository root, the checkout's own sglang_glm_ext comes first on sys.path (as it will for
    # `python3 -m sglang.launch_server`): the same code as the wheel, whose dist-info supplies the entry point.
    if mod == "sglang_glm_ext" and where.startswith(os.path.realpath(os.environ["GPUCARRY_REPO"]) + os.sep):
        origins.append("sglang_glm_ext from the checkout")
    elif not where.startswith(site + os.sep):
        problems.append(f"{mod} comes from {where}, not {site}")
    try:
        versions[mod] = md.version(dist)
    except md.PackageNotFoundError:
        problems.append(f"no {dist} metadata")
    if want and versions.get(mod) != want:
        problems.append(f"{dist} is {versions.get(mod)}, want {want}")
if "xxhash" in versions:
    import xxhash
    if tuple(int(x) for x in xxhash.VERSION.split(".")[:2]) < (4, 1):
        problems.append(f"xxhash {xxhash.VERSION} < 4.1.0")
eps = [ep for ep in md.entry_points(group="sglang.srt.plugins") if ep.value.startswith("sglang_glm_ext")]
if not eps:
    problems.append("no sglang.srt.plugins entry point for sglang_glm_ext")
if problems:
    print("install_carry: FAIL: " + "; ".join(problems), file=sys.stderr)
    sys.exit(1)
print("install_carry: ok: python " + sys.version.split()[0] + ", " + ", ".join(f"{k} {v}" for k, v in versions.items())
      + f", plugin entry point {eps[0].name} = {eps[0].value}" + "".join(f" ({o})" for o in origins))
EOF
}

_gpucarry_install
_gpucarry_rc=$?
unset -f _gpucarry_install
# shellcheck disable=SC2317
return $_gpucarry_rc 2>/dev/null || exit $_gpucarry_rc
