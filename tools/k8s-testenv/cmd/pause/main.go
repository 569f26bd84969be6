// Command pause is the pod sandbox's first process for the single-node cluster of
// tools/k8s-node: the container that holds a pod's namespaces open while its real containers
// come and go. The node cannot pull registry.k8s.io/pause, so containerd's sandbox_image
// points at this program, packed into a one-file image by tools/k8s-node/build-image.sh.
//
// What it must do, and nothing more: stay alive until the kubelet stops the sandbox (SIGTERM
// or SIGINT, then exit 0), and reap any child that gets re-parented to it as PID 1 of the
// pod's PID namespace, so that no zombie outlives its container.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	children := make(chan os.Signal, 16)
	signal.Notify(children, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			os.Exit(0)
		case <-children:
			// Reap every child that has exited; WNOHANG so that live ones are left alone.
			for {
				var status syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
