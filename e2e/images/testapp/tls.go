package main

// mTLS with pod certificates (KEP-4317): the kubelet writes the credential bundle (the private
// key, then the chain, leaf first) and a ClusterTrustBundle projection writes the roots. Both are
// rotated in place through a ..data symlink swap, so nothing here is read once: every handshake
// reads the files again (they are a few KiB), and a changed leaf is logged so tests see the
// rotation reach the process.

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// tlsFiles are one side's credential bundle and roots, by path.
type tlsFiles struct {
	bundle string
	roots  string
	out    io.Writer // where "tls: loaded leaf" lines go

	mu     sync.Mutex
	serial *big.Int // the leaf last logged
}

// newTLSFiles resolves NAME against DIR; an absolute NAME stands alone, because the trust bundle
// may be mounted apart from the credential bundle.
func newTLSFiles(dir, bundle, roots string, out io.Writer) *tlsFiles {
	join := func(name string) string {
		if filepath.IsAbs(name) {
			return name
		}
		return filepath.Join(dir, name)
	}
	return &tlsFiles{bundle: join(bundle), roots: join(roots), out: out}
}

// identity is a parsed credential bundle.
type identity struct {
	cert tls.Certificate
	leaf *x509.Certificate
	id   string // the leaf's SPIFFE ID
}

// identity reads the credential bundle now and logs the leaf when its serial changed.
func (f *tlsFiles) identity() (*identity, error) {
	data, err := os.ReadFile(f.bundle)
	if err != nil {
		return nil, fmt.Errorf("credential bundle: %w", err)
	}
	me, err := parseCredentialBundle(data)
	if err != nil {
		return nil, fmt.Errorf("credential bundle %s: %w", f.bundle, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.serial == nil || f.serial.Cmp(me.leaf.SerialNumber) != 0 {
		f.serial = me.leaf.SerialNumber
		fmt.Fprintf(f.out, "tls: loaded leaf serial=%x not_after=%s\n",
			me.leaf.SerialNumber, me.leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return me, nil
}

// rootPool reads the trust bundle now.
func (f *tlsFiles) rootPool() (*x509.CertPool, error) {
	data, err := os.ReadFile(f.roots)
	if err != nil {
		return nil, fmt.Errorf("trust bundle: %w", err)
	}
	pool := x509.NewCertPool()
	n := 0
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("trust bundle %s: certificate %d: %w", f.roots, n+1, err)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("trust bundle %s: no CERTIFICATE block", f.roots)
	}
	return pool, nil
}

// parseCredentialBundle reads the kubelet's layout: one private key block, then the chain, leaf
// first. The key is accepted anywhere in the file, the certificates keep their order.
func parseCredentialBundle(data []byte) (*identity, error) {
	var key crypto.PrivateKey
	var chain [][]byte
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		switch block.Type {
		case "PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY":
			if key != nil {
				return nil, errors.New("more than one private key block")
			}
			k, err := parsePrivateKey(block)
			if err != nil {
				return nil, err
			}
			key = k
		case "CERTIFICATE":
			chain = append(chain, block.Bytes)
		}
	}
	if key == nil {
		return nil, errors.New(`no key block ("PRIVATE KEY", "EC PRIVATE KEY" or "RSA PRIVATE KEY")`)
	}
	if len(chain) == 0 {
		return nil, errors.New("no certificate after the key")
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return nil, fmt.Errorf("leaf certificate: %w", err)
	}
	pub, ok := key.(interface{ Public() crypto.PublicKey })
	if !ok {
		return nil, fmt.Errorf("private key of type %T has no public key", key)
	}
	if eq, ok := pub.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !eq.Equal(leaf.PublicKey) {
		return nil, fmt.Errorf("key does not match leaf (serial %x, subject %q)", leaf.SerialNumber, leaf.Subject.String())
	}
	id, err := spiffeID(leaf)
	if err != nil {
		return nil, err
	}
	return &identity{cert: tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: leaf}, leaf: leaf, id: id}, nil
}

func parsePrivateKey(block *pem.Block) (crypto.PrivateKey, error) {
	var key crypto.PrivateKey
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	}
	if err != nil {
		return nil, fmt.Errorf("%s block: %w", block.Type, err)
	}
	return key, nil
}

// spiffeID is the one spiffe:// URI SAN of a leaf.
func spiffeID(leaf *x509.Certificate) (string, error) {
	var ids []string
	for _, u := range leaf.URIs {
		if u.Scheme == "spiffe" {
			ids = append(ids, u.String())
		}
	}
	switch len(ids) {
	case 1:
		return ids[0], nil
	case 0:
		return "", fmt.Errorf("leaf without SPIFFE URI (serial %x, subject %q, URIs %v)", leaf.SerialNumber, leaf.Subject.String(), leaf.URIs)
	default:
		return "", fmt.Errorf("leaf with %d SPIFFE URIs %v (serial %x), want exactly one", len(ids), ids, leaf.SerialNumber)
	}
}

// verifyPeer checks a presented chain against the roots, with the rest of the chain as
// intermediates, and its SPIFFE ID against peers (any when empty). Host names play no part: a
// SPIFFE identity is the URI SAN. Any extended key usage is accepted, as the signer decides them.
func verifyPeer(role string, chain []*x509.Certificate, roots *x509.CertPool, peers []string) (string, error) {
	if len(chain) == 0 {
		return "", fmt.Errorf("%s presented no certificate", role)
	}
	intermediates := x509.NewCertPool()
	for _, c := range chain[1:] {
		intermediates.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: intermediates,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return "", fmt.Errorf("%s chain does not reach the roots (leaf serial %x): %w", role, chain[0].SerialNumber, err)
	}
	id, err := spiffeID(chain[0])
	if err != nil {
		return "", fmt.Errorf("%s %w", role, err)
	}
	if len(peers) == 0 {
		return id, nil
	}
	for _, p := range peers {
		if p == id {
			return id, nil
		}
	}
	want := peers[0]
	if len(peers) > 1 {
		want = "one of " + strings.Join(peers, ", ")
	}
	return "", fmt.Errorf("peer SPIFFE ID mismatch: %s is %s, want %s", role, id, want)
}

// serverConfig requires a client certificate and builds each handshake's config from the files
// as they are at that moment.
func (f *tlsFiles) serverConfig(peers []string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			me, err := f.identity()
			if err != nil {
				return nil, err
			}
			roots, err := f.rootPool()
			if err != nil {
				return nil, err
			}
			return &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{me.cert},
				NextProtos:   []string{"http/1.1"},
				// Verified below instead of by ClientCAs, for the SPIFFE ID and any key usage.
				ClientAuth: tls.RequireAnyClientCert,
				VerifyConnection: func(cs tls.ConnectionState) error {
					_, err := verifyPeer("client", cs.PeerCertificates, roots, peers)
					return err
				},
			}, nil
		},
	}
}

// tlsHandler serves /healthz and /whoami, the verified client's SPIFFE ID.
func tlsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/whoami", func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			http.Error(w, "no client certificate", http.StatusUnauthorized)
			return
		}
		id, err := spiffeID(r.TLS.PeerCertificates[0])
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		fmt.Fprintln(w, id)
	})
	return mux
}

// fetchOnce makes one GET on a new connection, so each request is a fresh handshake with the
// files as they are now, and returns the "fetch ok" line.
func (f *tlsFiles) fetchOnce(ctx context.Context, target string, peers []string) (string, error) {
	me, err := f.identity()
	if err != nil {
		return "", err
	}
	roots, err := f.rootPool()
	if err != nil {
		return "", err
	}
	transport := &http.Transport{
		TLSClientConfig: &tls.Config{
			MinVersion: tls.VersionTLS12,
			// Host names mean nothing to a SPIFFE identity: VerifyConnection checks the chain.
			InsecureSkipVerify: true,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				return &me.cert, nil
			},
			VerifyConnection: func(cs tls.ConnectionState) error {
				_, err := verifyPeer("server", cs.PeerCertificates, roots, peers)
				return err
			},
		},
		DisableKeepAlives: true,
	}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport, Timeout: 10 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			// The URL is known to the caller; the reason is what matters.
			return "", uerr.Err
		}
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return "", fmt.Errorf("read body: %w", err)
	}
	trimmed := oneLine(string(body))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %s: %s", resp.Status, trimmed)
	}
	leaf := resp.TLS.PeerCertificates[0]
	peer, _ := spiffeID(leaf) // verified in the handshake
	return fmt.Sprintf("fetch ok peer=%s me=%s body=%s leaf_serial=%x leaf_not_after=%s",
		peer, me.id, trimmed, leaf.SerialNumber, leaf.NotAfter.UTC().Format(time.RFC3339)), nil
}

// fetchLoop makes count requests interval apart, one line each, and reports whether all
// succeeded; stop ends it early.
func (f *tlsFiles) fetchLoop(out io.Writer, target string, peers []string, count int, interval time.Duration, stop <-chan os.Signal) bool {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	ok := true
	for i := 0; i < count; i++ {
		if i > 0 {
			select {
			case <-time.After(interval):
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			fmt.Fprintln(out, "terminated")
			return ok
		}
		line, err := f.fetchOnce(ctx, target, peers)
		if err != nil {
			ok = false
			line = "fetch error: " + oneLine(err.Error())
		}
		fmt.Fprintln(out, line)
	}
	return ok
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// peerList is --peer: repeatable, each value comma-separated SPIFFE IDs.
type peerList []string

func (p *peerList) String() string { return strings.Join(*p, ",") }

func (p *peerList) Set(v string) error {
	for _, id := range strings.Split(v, ",") {
		id = strings.TrimSpace(id)
		if id == "" {
			continue
		}
		if u, err := url.Parse(id); err != nil || u.Scheme != "spiffe" || u.Host == "" {
			return fmt.Errorf("%q is not a SPIFFE ID (spiffe://<trust domain>/...)", id)
		}
		*p = append(*p, id)
	}
	return nil
}
