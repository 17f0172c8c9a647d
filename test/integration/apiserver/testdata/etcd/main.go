// Command etcd is etcd: its main function is etcd's own entry point,
// go.etcd.io/etcd/server/v3/etcdmain, at the release this module's go.mod
// pins. It lets the integration tests run with only Go installed: when
// neither $ETCD_BIN nor $PATH provides an etcd binary,
// [github.com/coalescer/dispatch/test/integration/apiserver.EtcdBinary]
// builds this module once into the user's cache directory and runs that.
//
// It is test data of package apiserver, a module of its own under
// testdata/ (which the go command's patterns never enter) and outside
// go.work, so that etcd's server dependencies never change the versions the
// workspace resolves. Build it by hand with
//
//	GOWORK=off go build -C test/integration/apiserver/testdata/etcd -o /tmp/etcd .
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
