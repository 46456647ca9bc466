# Sourced by the install scripts: fetches one pinned wheel from PyPI and checks its sha256.
#
#   wheel=$(pinned_wheel NAME VERSION SHA256 DIR [pip download options...])
#
# prints the wheel's path; the wheel is kept in DIR/wheel (emptied first); progress to stderr.
pinned_wheel() {
  local name=$1 version=$2 sha=$3 dir=$4
  shift 4
  rm -rf "$dir/wheel"
  mkdir -p "$dir/wheel"
  echo "fetching $name==$version" >&2
  pip download --quiet "$name==$version" --no-deps --only-binary=:all: "$@" -d "$dir/wheel" >&2
  local wheel
  wheel=$(ls "$dir"/wheel/*.whl)
  echo "$sha  $wheel" | sha256sum -c --quiet - >&2
  echo "$wheel"
}
