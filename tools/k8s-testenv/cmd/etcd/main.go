// Command etcd is the etcd server, built from go.etcd.io/etcd/server/v3 for the
// Sluice test control plane (see ../../build.sh). It is etcd's own entry point,
// etcdmain.Main, with nothing added: the wrapper only exists so that etcd is built
// from the Go module proxy at the version the k8s.io/kubernetes release pins.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
