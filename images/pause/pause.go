// The sandbox ("pause") container of the real test nodes (hack/node.sh): it holds the pod's
// namespaces and exits on SIGTERM/SIGINT. A static Go binary in a FROM-scratch image, built
// locally because no registry is reachable from the test machines.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
