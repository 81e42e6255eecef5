// Command testapp is the in-cluster tests' application and injected-container image
// (splice-testapp:e2e). One static binary, four behaviours:
//
//	testapp [--mark FILE] serve [--port N]   HTTP on N (default 8080): /healthz answers 200
//	testapp [--mark FILE] serve --tls DIR [--port N] [--peer ID]...
//	                                         HTTPS with mTLS on N (default 8443), and nothing else:
//	                                         /healthz answers 200, /whoami the client's SPIFFE ID
//	testapp [--mark FILE] fetch --tls DIR URL [--peer ID]... [--count N] [--interval D]
//	                                         N mTLS GETs of URL (default 1), D apart (default 1s)
//	testapp [--mark FILE] exit CODE          exits with CODE at once
//	testapp [--mark FILE] sleep              waits for SIGTERM
//
// At start every command prints its environment and the name and contents of every file under
// the colon-separated paths in SHOW_PATHS, so a test reads from the logs what the container saw.
// --mark FILE writes "<command> <unix nanoseconds>" to FILE first: containers sharing a volume
// then show each other in which order they started. SIGTERM ends every command at once.
//
// --tls DIR is a pod certificate (KEP-4317): DIR/credentials.pem is the kubelet's credential
// bundle (the private key, then the chain, leaf first; the leaf names one SPIFFE ID as URI SAN)
// and DIR/roots.pem the ClusterTrustBundle's roots; --tls-bundle NAME and --tls-roots NAME rename
// them (an absolute NAME ignores DIR). Both sides present their leaf, check the other's chain
// against the roots (host names play no part) and, with --peer (repeatable or comma-separated),
// its SPIFFE ID. The files are read again at every handshake, as the kubelet rotates them, and
// "tls: loaded leaf serial=<hex> not_after=<RFC3339>" is printed whenever the leaf changes.
// serve refuses to start without readable files (the kubelet writes them before the container
// starts). fetch makes each request on a new connection and prints per request
//
//	fetch ok peer=<server ID> me=<own ID> body=<body> leaf_serial=<server's> leaf_not_after=<...>
//
// or "fetch error: <reason>", goes on after failures and exits 1 if any request failed.
package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log"
	"net"
	"net/http"
	"net/url"
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
	case "fetch":
		fetch(args[1:], stop)
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

// tlsFlags are the flags serve and fetch share.
type tlsFlags struct {
	dir, bundle, roots string
	peers              peerList
}

func (t *tlsFlags) register(flags *flag.FlagSet) {
	flags.StringVar(&t.dir, "tls", "", "directory of the pod certificate files: mTLS")
	flags.StringVar(&t.bundle, "tls-bundle", "credentials.pem", "credential bundle (key, then chain) in the --tls directory")
	flags.StringVar(&t.roots, "tls-roots", "roots.pem", "trust bundle (root certificates) in the --tls directory")
	flags.Var(&t.peers, "peer", "SPIFFE ID accepted as peer (repeatable, comma-separated); default any")
}

// check refuses the TLS flags without --tls, rather than silently serving plain HTTP.
func (t *tlsFlags) check(flags *flag.FlagSet) {
	if t.dir != "" {
		return
	}
	flags.Visit(func(f *flag.Flag) {
		if strings.HasPrefix(f.Name, "tls-") || f.Name == "peer" {
			usage(fmt.Sprintf("%s: --%s needs --tls DIR", flags.Name(), f.Name))
		}
	})
}

func serve(args []string, stop <-chan os.Signal) {
	flags := flag.NewFlagSet("serve", flag.ContinueOnError)
	port := flags.Int("port", 8080, "port to listen on, all addresses; with --tls the default is 8443")
	var t tlsFlags
	t.register(flags)
	if err := flags.Parse(args); err != nil {
		os.Exit(2)
	}
	if flags.NArg() > 0 {
		usage("serve takes no arguments, got " + strings.Join(flags.Args(), " "))
	}
	t.check(flags)
	portSet := false
	flags.Visit(func(f *flag.Flag) { portSet = portSet || f.Name == "port" })
	if t.dir != "" && !portSet {
		*port = 8443
	}
	if *port < 1 || *port > 65535 {
		usage(fmt.Sprintf("serve: --port must be 1..65535, got %d", *port))
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	var handler http.Handler = mux
	var files *tlsFiles
	if t.dir != "" {
		files = newTLSFiles(t.dir, t.bundle, t.roots, os.Stdout)
		// The kubelet writes the files before the container starts: missing ones are a mistake
		// to show at once, not at the first handshake.
		if _, err := files.identity(); err != nil {
			fmt.Fprintf(os.Stderr, "testapp: serve: %v\n", err)
			os.Exit(1)
		}
		if _, err := files.rootPool(); err != nil {
			fmt.Fprintf(os.Stderr, "testapp: serve: %v\n", err)
			os.Exit(1)
		}
		handler = tlsHandler()
	}
	listener, err := net.Listen("tcp", fmt.Sprintf(":%d", *port))
	if err != nil {
		fmt.Fprintf(os.Stderr, "testapp: listen on %d: %v\n", *port, err)
		os.Exit(1)
	}
	server := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second,
		ErrorLog: log.New(os.Stderr, "testapp: ", 0)}
	if files != nil {
		listener = tls.NewListener(listener, files.serverConfig(t.peers))
		fmt.Printf("serving https on %d, peers %s\n", *port, peersOrAny(t.peers))
	} else {
		fmt.Printf("serving on %d\n", *port)
	}
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

func fetch(args []string, stop <-chan os.Signal) {
	flags := flag.NewFlagSet("fetch", flag.ContinueOnError)
	count := flags.Int("count", 1, "requests to make")
	interval := flags.Duration("interval", time.Second, "time between requests")
	var t tlsFlags
	t.register(flags)
	// Flags may follow the URL: parse again after each argument.
	var positional []string
	for {
		if err := flags.Parse(args); err != nil {
			os.Exit(2)
		}
		args = flags.Args()
		if len(args) == 0 {
			break
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
	if t.dir == "" {
		usage("fetch needs --tls DIR")
	}
	if len(positional) != 1 {
		usage(fmt.Sprintf("fetch takes one URL, got %d arguments", len(positional)))
	}
	target, err := url.Parse(positional[0])
	if err != nil || target.Scheme != "https" || target.Host == "" {
		usage("fetch URL must be https://HOST[:PORT]/PATH, got " + positional[0])
	}
	if *count < 1 {
		usage(fmt.Sprintf("fetch --count must be at least 1, got %d", *count))
	}
	if *interval < 0 {
		usage(fmt.Sprintf("fetch --interval must not be negative, got %s", *interval))
	}
	files := newTLSFiles(t.dir, t.bundle, t.roots, os.Stdout)
	if !files.fetchLoop(os.Stdout, target.String(), t.peers, *count, *interval, stop) {
		os.Exit(1)
	}
}

func peersOrAny(peers []string) string {
	if len(peers) == 0 {
		return "any"
	}
	return strings.Join(peers, ",")
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

const usageText = `usage: testapp [--mark FILE] COMMAND
  serve [--port N] [--tls DIR [--tls-bundle NAME] [--tls-roots NAME] [--peer SPIFFE_ID]...]
  fetch --tls DIR [--tls-bundle NAME] [--tls-roots NAME] [--peer SPIFFE_ID]...
        [--count N] [--interval D] URL
  exit CODE
  sleep
`

func usage(why string) {
	fmt.Fprintf(os.Stderr, "testapp: %s\n%s", why, usageText)
	os.Exit(2)
}
