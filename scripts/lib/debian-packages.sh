# Sourced by the install scripts. install_missing PKG...: installs Debian's packages named (the
# ones a script found missing) when run as root, else says which are missing and fails.
install_missing() {
  [ $# -gt 0 ] || return 0
  if [ "$(id -u)" = 0 ]; then
    echo "installing Debian's $*" >&2
    (apt-get install -y -qq --no-install-recommends "$@" ||
      (apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@")) >&2
  else
    echo "missing: $* (apt-get install $*)" >&2
    return 1
  fi
}
