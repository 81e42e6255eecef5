// Command nodeprobe asks the real node's containerd, over the CRI the kubelet uses, the two
// questions up.sh must settle before any pod may run there:
//
//	nodeprobe pull-guard SOCKET       every pull of an image the node lacks fails at once, at the
//	                                  dead loopback port the registry configuration names, for
//	                                  Docker Hub, registry.k8s.io and any other registry
//	nodeprobe has-images SOCKET REF…  each image is present (imported), so nothing needs a pull
//
// and down.sh's, and the pods' way to the API server:
//
//	nodeprobe remove-all SOCKET       stops and removes every pod sandbox (the CNI plugins then
//	                                  release their addresses and veths), for a clean teardown
//	nodeprobe relay LISTEN TARGET     forwards TCP from LISTEN (the bridge's address) to TARGET
//	                                  (the API server on 127.0.0.1): pods reach the kubernetes
//	                                  Service through it, without kube-proxy
//
// It talks CRI rather than using ctr because ctr does not read the CRI plugin's registry
// configuration: only the kubelet's path shows what a pod would do.
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// deadPort is where the registry configuration sends every registry (up.sh writes it).
const deadPort = "127.0.0.1:9"

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: nodeprobe pull-guard|remove-all SOCKET | has-images SOCKET REF... | relay LISTEN TARGET")
		os.Exit(2)
	}
	if os.Args[1] == "relay" && len(os.Args) == 4 {
		relay(os.Args[2], os.Args[3])
		return
	}
	conn, err := grpc.NewClient("unix://"+os.Args[2], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail("connecting to %s: %v", os.Args[2], err)
	}
	images := runtimeapi.NewImageServiceClient(conn)
	switch os.Args[1] {
	case "pull-guard":
		pullGuard(images)
	case "has-images":
		hasImages(images, os.Args[3:])
	case "remove-all":
		removeAll(runtimeapi.NewRuntimeServiceClient(conn))
	default:
		fail("unknown command %q", os.Args[1])
	}
}

func pullGuard(images runtimeapi.ImageServiceClient) {
	// Absent names on the registries a manifest could name, with and without a host.
	refs := []string{
		"splice-pull-guard-absent:never",
		"docker.io/library/busybox:pull-guard-absent",
		"registry.k8s.io/pause:pull-guard-absent",
		"quay.io/splice/pull-guard:absent",
		"ghcr.io/splice/pull-guard:absent",
	}
	for _, ref := range refs {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		_, err := images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
		cancel()
		took := time.Since(start)
		switch {
		case err == nil:
			fail("pull guard broken: %s was pulled", ref)
		case !strings.Contains(err.Error(), deadPort):
			fail("pull guard broken: pulling %s failed without reaching %s (so it went elsewhere): %v", ref, deadPort, err)
		case took > 5*time.Second:
			fail("pull guard slow: pulling %s took %s before failing", ref, took)
		}
		fmt.Printf("pull guard: %s refused at %s in %s\n", ref, deadPort, took.Round(time.Millisecond))
	}
}

func hasImages(images runtimeapi.ImageServiceClient, refs []string) {
	for _, ref := range refs {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		status, err := images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
		cancel()
		if err != nil {
			fail("image status of %s: %v", ref, err)
		}
		if status.GetImage() == nil {
			fail("image %s is not on the node (run make image-load)", ref)
		}
		fmt.Printf("present: %s\n", ref)
	}
}

func removeAll(runtime runtimeapi.RuntimeServiceClient) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	list, err := runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		fail("listing pod sandboxes: %v", err)
	}
	failed := 0
	for _, sandbox := range list.GetItems() {
		id := sandbox.GetId()
		if _, err := runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
			fmt.Fprintf(os.Stderr, "nodeprobe: stopping sandbox %s: %v\n", id, err)
			failed++
			continue
		}
		if _, err := runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
			fmt.Fprintf(os.Stderr, "nodeprobe: removing sandbox %s: %v\n", id, err)
			failed++
		}
	}
	fmt.Printf("removed %d of %d pod sandboxes\n", len(list.GetItems())-failed, len(list.GetItems()))
	if failed > 0 {
		os.Exit(1)
	}
}

func relay(listen, target string) {
	listener, err := net.Listen("tcp", listen)
	if err != nil {
		fail("relay: %v", err)
	}
	for {
		client, err := listener.Accept()
		if err != nil {
			fail("relay: accept: %v", err)
		}
		go func() {
			defer client.Close()
			server, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				fmt.Fprintf(os.Stderr, "nodeprobe: relay to %s: %v\n", target, err)
				return
			}
			defer server.Close()
			done := make(chan struct{}, 2)
			pipe := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				// Half-close so the other direction drains before both ends close.
				if tcp, ok := dst.(*net.TCPConn); ok {
					_ = tcp.CloseWrite()
				}
				done <- struct{}{}
			}
			go pipe(server, client)
			go pipe(client, server)
			<-done
			<-done
		}()
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "nodeprobe: "+format+"\n", args...)
	os.Exit(1)
}
