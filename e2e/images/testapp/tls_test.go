package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMain runs the real main when re-executed by the CLI tests, so they see exit codes and
// output exactly as a container would.
func TestMain(m *testing.M) {
	if os.Getenv("TESTAPP_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const (
	serverID = "spiffe://cluster.local/ns/shop/sa/server"
	clientID = "spiffe://cluster.local/ns/shop/sa/client"
)

// ca is a test certificate authority.
type ca struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func newSerial(t *testing.T) *big.Int {
	t.Helper()
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatal(err)
	}
	return serial
}

func ecKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func sign(t *testing.T, template, parent *x509.Certificate, pub crypto.PublicKey, signer crypto.Signer) *x509.Certificate {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, template, parent, pub, signer)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// caTemplate is a CA certificate named name, valid for lifetime.
func caTemplate(t *testing.T, name string, lifetime time.Duration, usage x509.KeyUsage) *x509.Certificate {
	t.Helper()
	return &x509.Certificate{
		SerialNumber:          newSerial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(lifetime),
		KeyUsage:              usage,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
}

func newRoot(t *testing.T, name string) *ca {
	t.Helper()
	key := ecKey(t)
	template := caTemplate(t, name, 24*time.Hour, x509.KeyUsageCertSign|x509.KeyUsageCRLSign)
	return &ca{cert: sign(t, template, template, key.Public(), key), key: key}
}

func (c *ca) intermediate(t *testing.T, name string) *ca {
	t.Helper()
	key := ecKey(t)
	template := caTemplate(t, name, 12*time.Hour, x509.KeyUsageCertSign)
	return &ca{cert: sign(t, template, c.cert, key.Public(), c.key), key: key}
}

// leaf issues a pod certificate; the Splice signer's usages are not known here, so the server
// leaf only carries ClientAuth like a kube-apiserver-client-pod one, and must still serve.
func (c *ca) leaf(t *testing.T, id string, pub crypto.PublicKey) *x509.Certificate {
	t.Helper()
	template := &x509.Certificate{
		SerialNumber: newSerial(t),
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour).Truncate(time.Second),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if id != "" {
		u, err := url.Parse(id)
		if err != nil {
			t.Fatal(err)
		}
		template.URIs = []*url.URL{u}
	}
	return sign(t, template, c.cert, pub, c.key)
}

func certPEM(certs ...*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

// keyPEM encodes key as the block type given, as the kubelet may.
func keyPEM(t *testing.T, key crypto.Signer, blockType string) []byte {
	t.Helper()
	var der []byte
	var err error
	switch blockType {
	case "PRIVATE KEY":
		der, err = x509.MarshalPKCS8PrivateKey(key)
	case "EC PRIVATE KEY":
		der, err = x509.MarshalECPrivateKey(key.(*ecdsa.PrivateKey))
	case "RSA PRIVATE KEY":
		der = x509.MarshalPKCS1PrivateKey(key.(*rsa.PrivateKey))
	}
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der})
}

// bundle is the kubelet's credential bundle: the key, then the leaf, then the intermediate.
func bundle(t *testing.T, key crypto.Signer, blockType string, chain ...*x509.Certificate) []byte {
	return append(keyPEM(t, key, blockType), certPEM(chain...)...)
}

// writeAtomically lays files out as the kubelet's atomic writer does: a timestamped directory,
// a ..data symlink to it swapped by rename, and each file a symlink through ..data.
func writeAtomically(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	stamp, err := os.MkdirTemp(dir, "..stamp_")
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(stamp, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); errors.Is(err, os.ErrNotExist) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(stamp), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if old != "" {
		_ = os.RemoveAll(filepath.Join(dir, old))
	}
}

// pod is one side's pod certificate directory and what it holds.
type pod struct {
	dir  string
	leaf *x509.Certificate
}

// setUp makes a root, an intermediate, a server pod (ECDSA P-256, PKCS#8) and a client pod
// (RSA 2048, PKCS#1), both leaves under the intermediate and both trusting the root.
func setUp(t *testing.T) (root, inter *ca, server, client pod) {
	t.Helper()
	root = newRoot(t, "splice test root")
	inter = root.intermediate(t, "splice test intermediate")
	server = newPod(t, inter, serverID, ecKey(t), "PRIVATE KEY", root)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	client = newPod(t, inter, clientID, rsaKey, "RSA PRIVATE KEY", root)
	return root, inter, server, client
}

func newPod(t *testing.T, issuer *ca, id string, key crypto.Signer, blockType string, roots ...*ca) pod {
	t.Helper()
	p := pod{dir: t.TempDir()}
	p.issue(t, issuer, id, key, blockType, roots...)
	return p
}

// issue writes a new leaf under issuer (and issuer's certificate unless it is a root).
func (p *pod) issue(t *testing.T, issuer *ca, id string, key crypto.Signer, blockType string, roots ...*ca) {
	t.Helper()
	p.leaf = issuer.leaf(t, id, key.Public())
	chain := []*x509.Certificate{p.leaf}
	if !bytes.Equal(issuer.cert.RawIssuer, issuer.cert.RawSubject) {
		chain = append(chain, issuer.cert)
	}
	var rootCerts []*x509.Certificate
	for _, r := range roots {
		rootCerts = append(rootCerts, r.cert)
	}
	writeAtomically(t, p.dir, map[string][]byte{
		"credentials.pem": bundle(t, key, blockType, chain...),
		"roots.pem":       certPEM(rootCerts...),
	})
}

// syncBuffer collects log lines from the server goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startServer serves the pod's files as serve --tls does and returns the /whoami URL and the
// server's output (its "tls: loaded" lines and handshake errors).
func startServer(t *testing.T, p pod, peers ...string) (string, *syncBuffer) {
	t.Helper()
	out := &syncBuffer{}
	files := newTLSFiles(p.dir, "credentials.pem", "roots.pem", out)
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := &http.Server{Handler: tlsHandler(), ErrorLog: log.New(out, "", 0)}
	go func() { _ = server.Serve(tls.NewListener(listener, files.serverConfig(peers))) }()
	t.Cleanup(func() { _ = server.Close() })
	return "https://" + listener.Addr().String() + "/whoami", out
}

func fetchFrom(t *testing.T, p pod, target string, peers ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	return newTLSFiles(p.dir, "credentials.pem", "roots.pem", &out).fetchOnce(context.Background(), target, peers)
}

func TestTwoPodsCompleteMTLSAndEachSeesTheOthersSpiffeID(t *testing.T) {
	_, _, server, client := setUp(t)
	for _, peers := range [][2][]string{{nil, nil}, {{clientID}, {serverID}}} {
		target, _ := startServer(t, server, peers[0]...)
		line, err := fetchFrom(t, client, target, peers[1]...)
		if err != nil {
			t.Fatalf("peers %v: %v", peers, err)
		}
		want := fmt.Sprintf("fetch ok peer=%s me=%s body=%s leaf_serial=%x leaf_not_after=%s",
			serverID, clientID, clientID, server.leaf.SerialNumber, server.leaf.NotAfter.UTC().Format(time.RFC3339))
		if line != want {
			t.Errorf("peers %v:\n got %s\nwant %s", peers, line, want)
		}
	}
}

func TestPeerAcceptsAnyOfSeveralCommaSeparatedOrRepeatedIDs(t *testing.T) {
	_, _, server, client := setUp(t)
	var peers peerList
	for _, v := range []string{"spiffe://cluster.local/ns/a/sa/b, " + clientID, "spiffe://other/x"} {
		if err := peers.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	target, _ := startServer(t, server, peers...)
	if _, err := fetchFrom(t, client, target); err != nil {
		t.Fatal(err)
	}
	if err := peers.Set("https://cluster.local/ns/a"); err == nil {
		t.Error("--peer accepted a non-SPIFFE ID")
	}
}

func TestFetchRefusesAServerWhoseSpiffeIDIsNotTheExpectedPeer(t *testing.T) {
	_, _, server, client := setUp(t)
	target, _ := startServer(t, server)
	want := "spiffe://cluster.local/ns/shop/sa/payments"
	_, err := fetchFrom(t, client, target, want)
	if err == nil {
		t.Fatal("fetch succeeded against the wrong server")
	}
	for _, s := range []string{"peer SPIFFE ID mismatch", serverID, want} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not name %q", err, s)
		}
	}
}

func TestServeRefusesAClientWhoseSpiffeIDIsNotAnAcceptedPeer(t *testing.T) {
	_, _, server, client := setUp(t)
	want := "spiffe://cluster.local/ns/shop/sa/frontend"
	target, out := startServer(t, server, want)
	line, err := fetchFrom(t, client, target)
	if err == nil {
		t.Fatalf("the server accepted the wrong client: %s", line)
	}
	t.Logf("the client sees: %v", err)
	waitFor(t, out, "peer SPIFFE ID mismatch: client is "+clientID+", want "+want)
	t.Logf("the server logs: %s", out)
}

func TestServeRefusesAClientWhoseChainDoesNotReachTheRoots(t *testing.T) {
	root, _, server, _ := setUp(t)
	// Another signer's pod, which trusts both roots, so only the server's check can fail.
	other := newRoot(t, "someone else's root")
	stranger := newPod(t, other.intermediate(t, "someone else's intermediate"), clientID, ecKey(t), "EC PRIVATE KEY", root, other)
	target, out := startServer(t, server)
	if line, err := fetchFrom(t, stranger, target); err == nil {
		t.Fatalf("the server accepted a client of another root: %s", line)
	}
	waitFor(t, out, "client chain does not reach the roots")
}

func TestServeRefusesAClientWithoutCertificate(t *testing.T) {
	_, _, server, _ := setUp(t)
	target, out := startServer(t, server)
	plain := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := plain.Get(target)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("the server answered %s to a client without certificate", resp.Status)
	}
	waitFor(t, out, "client didn't provide a certificate")
}

func TestFetchRefusesAServerWhoseChainDoesNotReachTheRoots(t *testing.T) {
	root, _, _, client := setUp(t)
	other := newRoot(t, "someone else's root")
	impostor := newPod(t, other, serverID, ecKey(t), "PRIVATE KEY", root, other)
	target, _ := startServer(t, impostor)
	_, err := fetchFrom(t, client, target)
	if err == nil || !strings.Contains(err.Error(), "server chain does not reach the roots") {
		t.Fatalf("fetch from a server of another root: %v", err)
	}
}

func TestServerPresentsItsNewLeafAtTheNextHandshakeAfterTheKubeletRotatesIt(t *testing.T) {
	root, inter, server, client := setUp(t)
	target, out := startServer(t, server)
	first, err := fetchFrom(t, client, target)
	if err != nil {
		t.Fatal(err)
	}
	old := server.leaf.SerialNumber
	if !strings.Contains(first, fmt.Sprintf("leaf_serial=%x ", old)) {
		t.Fatalf("before the rotation: %s", first)
	}
	// A new key and leaf, in another of the kubelet's encodings, swapped in under the server.
	server.issue(t, inter, serverID, ecKey(t), "EC PRIVATE KEY", root)
	second, err := fetchFrom(t, client, target)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(second, fmt.Sprintf("leaf_serial=%x ", server.leaf.SerialNumber)) {
		t.Fatalf("after the rotation the server presented %s, want serial %x", second, server.leaf.SerialNumber)
	}
	logs := out.String()
	for _, serial := range []*big.Int{old, server.leaf.SerialNumber} {
		line := fmt.Sprintf("tls: loaded leaf serial=%x not_after=", serial)
		if strings.Count(logs, line) != 1 {
			t.Errorf("want %q logged once, got:\n%s", line, logs)
		}
	}
}

func TestCredentialBundleErrorsNameWhatIsWrong(t *testing.T) {
	root := newRoot(t, "root")
	key := ecKey(t)
	leaf := root.leaf(t, serverID, key.Public())
	noURI := root.leaf(t, "", key.Public())
	otherLeaf := root.leaf(t, serverID, ecKey(t).Public())
	cases := []struct {
		name   string
		bundle []byte // nil: no file
		roots  []byte
		want   string
	}{
		{"missing bundle", nil, certPEM(root.cert), "credentials.pem: no such file"},
		{"no key block", certPEM(leaf), certPEM(root.cert), "no key block"},
		{"no certificate", keyPEM(t, key, "PRIVATE KEY"), certPEM(root.cert), "no certificate"},
		{"key does not match leaf", bundle(t, key, "PRIVATE KEY", otherLeaf), certPEM(root.cert), "key does not match leaf"},
		{"leaf without SPIFFE URI", bundle(t, key, "PRIVATE KEY", noURI), certPEM(root.cert), "leaf without SPIFFE URI"},
		{"missing roots", bundle(t, key, "PRIVATE KEY", leaf), nil, "roots.pem: no such file"},
		{"roots without certificate", bundle(t, key, "PRIVATE KEY", leaf), keyPEM(t, key, "PRIVATE KEY"), "roots.pem: no CERTIFICATE block"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, body := range map[string][]byte{"credentials.pem": c.bundle, "roots.pem": c.roots} {
				if body != nil {
					if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			line, err := fetchFrom(t, pod{dir: dir}, "https://127.0.0.1:1/whoami")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %q, %v; want an error naming %q", line, err, c.want)
			}
		})
	}
}

func TestBundleAndRootsNamesAreRelativeToTheDirectoryUnlessAbsolute(t *testing.T) {
	files := newTLSFiles("/var/run/id", "credentialbundle.pem", "/var/run/trust/ca.pem", io.Discard)
	if files.bundle != "/var/run/id/credentialbundle.pem" || files.roots != "/var/run/trust/ca.pem" {
		t.Fatalf("got %s and %s", files.bundle, files.roots)
	}
}

// waitFor waits for the server's log to show want: the handshake error is logged after the
// client has already seen the alert.
func waitFor(t *testing.T, out *syncBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("server log does not show %q:\n%s", want, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testapp runs the binary's main with args.
func testapp(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "TESTAPP_RUN_MAIN=1")
	return cmd
}

// appLines are the output lines with prefix, without the environment dump.
func appLines(out []byte, prefix string) []string {
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, prefix) {
			lines = append(lines, l)
		}
	}
	return lines
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func exitCode(err error) int {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

func TestServeAndFetchCommandsTalkMTLSUnderOtherFileNames(t *testing.T) {
	_, _, server, client := setUp(t)
	// Splice mounts credentialbundle.pem and ca.pem: the names are flags.
	for _, p := range []pod{server, client} {
		for from, to := range map[string]string{"credentials.pem": "credentialbundle.pem", "roots.pem": "ca.pem"} {
			if err := os.Symlink(from, filepath.Join(p.dir, to)); err != nil {
				t.Fatal(err)
			}
		}
	}
	port := freePort(t)
	serve := testapp("serve", "--tls", server.dir, "--tls-bundle", "credentialbundle.pem",
		"--tls-roots", "ca.pem", "--port", fmt.Sprint(port), "--peer", clientID)
	stdout, err := serve.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = serve.Process.Kill(); _ = serve.Wait() })
	lines := bufio.NewScanner(stdout)
	var seen []string
	for lines.Scan() && !strings.HasPrefix(lines.Text(), "serving https on") {
		seen = append(seen, lines.Text())
	}
	if want := fmt.Sprintf("tls: loaded leaf serial=%x ", server.leaf.SerialNumber); len(appLines([]byte(strings.Join(seen, "\n")), want)) != 1 {
		t.Errorf("serve did not log its leaf %q before serving", want)
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()

	target := fmt.Sprintf("https://localhost:%d/whoami", port)
	// Flags after the URL too, as a container's args would put them.
	out, err := testapp("fetch", "--tls", client.dir, "--tls-bundle", "credentialbundle.pem",
		"--tls-roots", "ca.pem", target, "--peer", serverID, "--count", "2", "--interval", "10ms").CombinedOutput()
	if code := exitCode(err); code != 0 {
		t.Fatalf("fetch exited %d:\n%s", code, out)
	}
	if ok := appLines(out, "fetch ok peer="+serverID+" me="+clientID+" body="+clientID+" leaf_serial="); len(ok) != 2 {
		t.Fatalf("want 2 fetch ok lines, got:\n%s", out)
	}
}

func TestFetchKeepsGoingAfterFailuresAndExitsOne(t *testing.T) {
	_, _, _, client := setUp(t)
	target := fmt.Sprintf("https://127.0.0.1:%d/whoami", freePort(t)) // nobody listens
	out, err := testapp("fetch", "--tls", client.dir, "--count", "3", "--interval", "1ms", target).CombinedOutput()
	if code := exitCode(err); code != 1 {
		t.Fatalf("fetch exited %d, want 1:\n%s", code, out)
	}
	if errs := appLines(out, "fetch error: "); len(errs) != 3 || !strings.Contains(errs[0], "connection refused") {
		t.Fatalf("want 3 fetch error lines naming the refusal, got:\n%s", out)
	}
}

func TestUsageErrorsExitTwoWithAMessage(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"fetch", "https://x/"}, "fetch needs --tls DIR"},
		{[]string{"fetch", "--tls", dir}, "fetch takes one URL"},
		{[]string{"fetch", "--tls", dir, "http://x/"}, "fetch URL must be https://"},
		{[]string{"fetch", "--tls", dir, "https://x/", "--count", "0"}, "--count must be at least 1"},
		{[]string{"serve", "--peer", clientID}, "--peer needs --tls DIR"},
		{[]string{"serve", "--tls", dir, "--peer", "sa/client"}, "is not a SPIFFE ID"},
		{[]string{"serve", "extra"}, "serve takes no arguments"},
	}
	for _, c := range cases {
		out, err := testapp(c.args...).CombinedOutput()
		if code := exitCode(err); code != 2 || !strings.Contains(string(out), c.want) {
			t.Errorf("%v: exit %d, want 2 and %q in:\n%s", c.args, code, c.want, out)
		}
	}
}
