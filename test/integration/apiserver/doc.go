// Package apiserver runs a real kube-apiserver and etcd for the test
// binary, for integration tests of github.com/coalescer/dispatch against
// the behaviour a production cluster has: optimistic concurrency,
// pods/binding semantics, server-side throttling and connections that die
// mid-request.
//
// [Start] launches etcd (see [StartEtcd]), then kube-apiserver, each as a
// child process of the test binary, and puts a [Proxy] in front of
// kube-apiserver. Each server gets credentials of its own, generated for
// the run: a serving certificate, a service account signing key and a
// static token file with two users. Tests drive the code under test with
// [Server.Config] (through the proxy, as an unprivileged user the inflight
// limits apply to) or [Server.ServiceAccountConfig], and make setup calls
// and assertions with [Server.AdminConfig] (direct, as a member of
// system:masters, never throttled nor recorded). Everything stops when the
// test ends, through t.Cleanup, and on Linux the kernel kills the servers
// if the test binary dies first. No server code runs in the test binary:
// its goroutines are the test's and client-go's alone, for goleak to
// check.
//
// The binaries come from $ETCD_BIN and $KUBE_APISERVER_BIN when set (etcd
// also from $PATH: Debian's etcd-server package installs /usr/bin/etcd).
// Otherwise the tests build them with the go command from this package's
// test data: the module testdata/etcd, whose go.mod pins an etcd server
// release of the 3.7 line, the one Kubernetes 1.37 is tested with, and the
// module testdata/kube-apiserver, whose go.mod pins k8s.io/kubernetes
// v1.37.2 and builds its cmd/kube-apiserver — without the race detector,
// which is for this repository's code, in the test binaries. So the tests
// need nothing but Go. Each build runs once per machine, into
// dispatch-etcd/ and dispatch-kube-apiserver/ under [os.UserCacheDir]
// (~/.cache on Linux), outside the workspace (GOWORK=off); later test runs
// reuse the binaries, and test binaries started at once share one build
// through a file lock. If a build fails, the test fails with an
// explanation: these tests are meant to run in CI, not to be skipped.
package apiserver
