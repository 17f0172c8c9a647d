// Package integration holds the tests of github.com/coalescer/dispatch
// against a real kube-apiserver and etcd, started by package
// [github.com/coalescer/dispatch/kube/integration/apiserver].
//
// They need an etcd binary ($ETCD_BIN or etcd in $PATH; .ci/run installs
// Debian's etcd-server) and fail without one.
package integration
