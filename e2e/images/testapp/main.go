// Command testapp is the in-cluster tests' application and injected-container image
// (splice-testapp:e2e). One static binary, three behaviours:
//
//	testapp [--mark FILE] serve [--port N]   HTTP on N (default 8080): /healthz answers 200
//	testapp [--mark FILE] exit CODE          exits with CODE at once
//	testapp [--mark FILE] sleep              waits for SIGTERM
//
// At start every command prints its environment and the name and contents of every file under
// the colon-separated paths in SHOW_PATHS, so a test reads from the logs what the container saw.
// --mark FILE writes "<command> <unix nanoseconds>" to FILE first: containers sharing a volume
// then show each other in which order they started. SIGTERM ends every command at once.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	flags := flag.NewFlagSet("testapp", flag.ContinueOnError)
	mark := flags.String("mark", "", "file to write '<command> <unix nanoseconds>' to at start")
	if err := flags.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	args := flags.Args()
	if len(args) == 0 {
		usage("no command")
	}
	command := args[0]
	if *mark != "" {
		line := fmt.Sprintf("%s %d\n", command, time.Now().UnixNano())
		if err := os.WriteFile(*mark, []byte(line), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "testapp: --mark %s: %v\n", *mark, err)
			os.Exit(1)
		}
	}
	show()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	switch command {
	case "serve":
		serve(args[1:], stop)
	case "exit":
		if len(args) != 2 {
			usage("exit takes one CODE")
		}
		code, err := strconv.Atoi(args[1])
		if err != nil || code < 0 || code > 255 {
			usage("exit CODE must be 0..255, got " + args[1])
		}
		fmt.Printf("exiting with %d\n", code)
		os.Exit(code)
	case "sleep":
		<-stop
		fmt.Println("terminated")
	default:
		usage("unknown command " + command)
	}
}

func serve(args []string, stop <-chan os.Signal) {
	flags := flag.NewFlagSet("serve", flag.ContinueOnError)
	port := flags.Int("port", 8080, "port to listen on, all addresses")
	if err := flags.Parse(args); err != nil {
		os.Exit(2)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	listener, err := net.Listen("tcp", fmt.Sprintf(":%d", *port))
	if err != nil {
		fmt.Fprintf(os.Stderr, "testapp: listen on %d: %v\n", *port, err)
		os.Exit(1)
	}
	fmt.Printf("serving on %d\n", *port)
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-stop
		_ = server.Close()
	}()
	if err := server.Serve(listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(os.Stderr, "testapp: serve: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("terminated")
}

// show prints the environment, then each file under SHOW_PATHS as "file PATH: CONTENTS".
func show() {
	env := os.Environ()
	sort.Strings(env)
	for _, kv := range env {
		fmt.Printf("env %s\n", kv)
	}
	for _, root := range strings.Split(os.Getenv("SHOW_PATHS"), ":") {
		if root == "" {
			continue
		}
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			// Projected volumes keep their files behind ..data symlinks; the links are enough.
			if d.IsDir() || strings.Contains(path, "/..") {
				return nil
			}
			body, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			fmt.Printf("file %s: %s\n", path, strings.TrimSpace(string(body)))
			return nil
		})
		if err != nil {
			fmt.Printf("path %s: %v\n", root, err)
		}
	}
}

func usage(why string) {
	fmt.Fprintf(os.Stderr, "testapp: %s\nusage: testapp [--mark FILE] serve [--port N] | exit CODE | sleep\n", why)
	os.Exit(2)
}
