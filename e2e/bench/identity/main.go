// Command identity-bench is the driver of `make bench-identity` (see ../identity.sh, which starts
// the control plane with NodeRestriction on, installs the CRD and runs one `splice run`).
//
// It stands in for the kubelets of its own kwok nodes: for every pod Splice injected with a
// `podCertificate` volume it creates one PodCertificateRequest the way the v1.36 kubelet's
// podcertificate manager does (k8s.io/kubernetes pkg/kubelet/podcertificate, createPodCertificateRequest):
// generateName "req-", an ownerReference to the pod, the pod's name and UID, its service account's
// name and UID, its node's name and UID, the projection's signer, key type and maxExpirationSeconds,
// and a fresh key given as a stub PKCS#10 request signed by it (--form csr, what v1.36 sends) or
// as the deprecated pkixPublicKey (DER SPKI) with proofOfPossession, the key's signature over the
// pod UID's bytes (ECDSA: ASN.1 over their SHA-256; Ed25519: over the bytes; --form pkix). Each
// create is made as the pod's node (impersonating system:node:<node>, group system:nodes), so the
// Node authorizer and the NodeRestriction admission plugin check it as they check a kubelet's.
//
// Issuance latency of a request: from its create call's return to the moment a watch of all
// PodCertificateRequests shows it Issued (status.certificateChain set), Denied or Failed, read
// with Go's monotonic clock. The signer's CPU is utime+stime of the `splice run` process
// (/proc/<pid>/stat) from just before the first create to the last answer; its memory is VmRSS
// and VmHWM afterwards.
package main

import (
	"bufio"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	certsv1beta1 "k8s.io/api/certificates/v1beta1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	signer      = "splice.dev/identity"
	nsLabel     = "bench.splice.dev/identity"
	nodeLabel   = "bench.splice.dev/identity-node"
	policyName  = "bench-identity"
	mountPath   = "/var/run/splice/identity"
	trustDomain = "cluster.local"
)

var policyGVR = schema.GroupVersionResource{Group: "splice.dev", Version: "v1alpha1", Resource: "injectionpolicies"}

type options struct {
	kubeconfig  string
	instance    string
	pods        int
	namespaces  int
	accounts    int
	nodes       int
	concurrency int
	rates       string
	form        string
	keyType     string
	asNode      bool
	splicePID   int
	admin       string
	clkTck      int
	idle        time.Duration
	timeout     time.Duration
	spliceBin   string
	out         string
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

func fatalf(format string, args ...any) {
	logf(format, args...)
	os.Exit(1)
}

func main() {
	var o options
	flag.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "admin kubeconfig")
	flag.StringVar(&o.instance, "instance", "bench", "the policy's e2e.splice.dev/instance label (splice run --policy-selector)")
	flag.IntVar(&o.pods, "pods", 1000, "pods (and requests) per row")
	flag.IntVar(&o.namespaces, "namespaces", 4, "namespaces the policy selects")
	flag.IntVar(&o.accounts, "service-accounts", 2, "service accounts per namespace")
	flag.IntVar(&o.nodes, "nodes", 4, "kwok nodes of the bench's own")
	flag.IntVar(&o.concurrency, "concurrency", 16, "creates in flight")
	flag.StringVar(&o.rates, "rates", "0", "one row per rate, comma-separated: requests created per second (0: as fast as --concurrency allows)")
	flag.StringVar(&o.form, "form", "csr", "csr: stubPKCS10Request (the v1.36 kubelet); pkix: pkixPublicKey + proofOfPossession")
	flag.StringVar(&o.keyType, "key-type", "ECDSAP256", "spec.identity.keyType: ECDSAP256 or ED25519")
	flag.BoolVar(&o.asNode, "as-node", true, "create each request as its node (impersonation); false: as the admin")
	flag.IntVar(&o.splicePID, "splice-pid", 0, "the splice run process")
	flag.StringVar(&o.admin, "admin", "", "splice run's admin address (host:port), for /metrics")
	flag.IntVar(&o.clkTck, "clk-tck", 100, "getconf CLK_TCK")
	flag.DurationVar(&o.idle, "idle", 10*time.Second, "idle window before the first row: the signer's CPU with nothing to sign")
	flag.DurationVar(&o.timeout, "timeout", 10*time.Minute, "per row, for all answers")
	flag.StringVar(&o.spliceBin, "splice-bin", "", "the splice binary (for the table's build note)")
	flag.StringVar(&o.out, "out", "", "also write the table here")
	flag.Parse()
	if o.form != "csr" && o.form != "pkix" {
		fatalf("--form must be csr or pkix")
	}
	var rates []float64
	for _, r := range strings.Split(o.rates, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(r), 64)
		if err != nil || v < 0 {
			fatalf("--rates: %q is not a rate", r)
		}
		rates = append(rates, v)
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		fatalf("kubeconfig: %v", err)
	}
	// No client-side throttling: the creates are bounded by --concurrency (and --rates) only.
	cfg.QPS, cfg.Burst = 5000, 10000
	// Splice's "injected" admission warning, once per pod, says nothing the checks below miss.
	cfg.WarningHandler = rest.NoWarnings{}
	admin := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)
	ctx := context.Background()

	b := &bench{o: o, cfg: cfg, admin: admin, dyn: dyn, nodeClients: map[string]*kubernetes.Clientset{}}
	b.setup(ctx)
	t := &table{}
	t.add("machine", fmt.Sprintf("%s; splice run: %s build", cpuNote(), buildNote(o.spliceBin)), "")
	t.add("requests made as", b.madeAs(), "as a kubelet")
	t.add("kwok nodes, namespaces, service accounts", fmt.Sprintf("%d, %d, %d per namespace", o.nodes, o.namespaces, o.accounts), "")
	if o.splicePID > 0 && o.idle > 0 {
		c0 := cpuSeconds(o.splicePID, o.clkTck)
		time.Sleep(o.idle)
		c1 := cpuSeconds(o.splicePID, o.clkTck)
		b.idleRate = (c1 - c0) / o.idle.Seconds()
		t.add("splice run's CPU while idle (pods present, nothing to sign)", fmt.Sprintf("%.3f s per minute (over %s)", b.idleRate*60, o.idle), "")
	}
	for i, rate := range rates {
		b.row(ctx, t, i, rate)
	}
	t.write(o.out)
}

type bench struct {
	o           options
	cfg         *rest.Config
	admin       *kubernetes.Clientset
	dyn         dynamic.Interface
	nodeUIDs    map[string]types.UID
	saUIDs      map[string]types.UID // namespace/name
	nodeClients map[string]*kubernetes.Clientset
	idleRate    float64
}

func (b *bench) madeAs() string {
	form := "stubPKCS10Request (as the v1.36 kubelet)"
	if b.o.form == "pkix" {
		form = "pkixPublicKey + proofOfPossession (deprecated form)"
	}
	who := "the admin (no impersonation)"
	if b.o.asNode {
		who = "its pod's node (system:node:<node>, group system:nodes; Node authorizer + NodeRestriction)"
	}
	return fmt.Sprintf("%s; %s, fresh %s key each", who, form, b.o.keyType)
}

func nsName(i int) string   { return fmt.Sprintf("bench-identity-%d", i) }
func saName(i int) string   { return fmt.Sprintf("sa-%d", i) }
func nodeName(i int) string { return fmt.Sprintf("kwok-identity-%d", i) }

// setup: the bench's kwok nodes (no status: kwok's node-initialize stage gives them room for a
// million pods), the namespaces and service accounts, and the policy, Ready.
func (b *bench) setup(ctx context.Context) {
	for i := 0; i < b.o.nodes; i++ {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name: nodeName(i),
			Annotations: map[string]string{
				"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
			Labels: map[string]string{
				"kubernetes.io/hostname": nodeName(i), "type": "kwok", nodeLabel: "true"},
		}}
		if _, err := b.admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			fatalf("creating node %s: %v", n.Name, err)
		}
	}
	b.nodeUIDs = map[string]types.UID{}
	waitFor("the bench's kwok nodes Ready", 120*time.Second, func() bool {
		for i := 0; i < b.o.nodes; i++ {
			n, err := b.admin.CoreV1().Nodes().Get(ctx, nodeName(i), metav1.GetOptions{})
			if err != nil || len(n.Spec.Taints) > 0 || !nodeReady(n) {
				return false
			}
			b.nodeUIDs[n.Name] = n.UID
		}
		return true
	})
	b.saUIDs = map[string]types.UID{}
	for i := 0; i < b.o.namespaces; i++ {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsName(i), Labels: map[string]string{nsLabel: "on"}}}
		if _, err := b.admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			fatalf("creating namespace %s: %v", ns.Name, err)
		}
		for j := 0; j < b.o.accounts; j++ {
			sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: saName(j)}}
			got, err := b.admin.CoreV1().ServiceAccounts(ns.Name).Create(ctx, sa, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				got, err = b.admin.CoreV1().ServiceAccounts(ns.Name).Get(ctx, sa.Name, metav1.GetOptions{})
			}
			if err != nil {
				fatalf("service account %s/%s: %v", ns.Name, sa.Name, err)
			}
			b.saUIDs[ns.Name+"/"+sa.Name] = got.UID
		}
	}
	policy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "splice.dev/v1alpha1", "kind": "InjectionPolicy",
		"metadata": map[string]any{"name": policyName, "labels": map[string]any{"e2e.splice.dev/instance": b.o.instance}},
		"spec": map[string]any{
			"mode":              "Webhook",
			"namespaceSelector": map[string]any{"matchLabels": map[string]any{nsLabel: "on"}},
			"identity": map[string]any{
				"mountPath": mountPath, "keyType": b.o.keyType, "maxExpirationSeconds": int64(3600)},
			"template": map[string]any{"containers": []any{map[string]any{
				"name": "bench-sidecar", "image": "registry.invalid/sidecar:1"}}},
		},
	}}
	if _, err := b.dyn.Resource(policyGVR).Create(ctx, policy, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		fatalf("creating the policy: %v", err)
	}
	waitFor("the identity policy Ready", 120*time.Second, func() bool {
		p, err := b.dyn.Resource(policyGVR).Get(ctx, policyName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		gen := p.GetGeneration()
		conds, _, _ := unstructured.NestedSlice(p.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			og, _ := m["observedGeneration"].(int64)
			if m["type"] == "Ready" && m["status"] == "True" && og == gen {
				return true
			}
		}
		return false
	})
	if b.o.asNode {
		for name := range b.nodeUIDs {
			c := rest.CopyConfig(b.cfg)
			c.Impersonate = rest.ImpersonationConfig{
				UserName: "system:node:" + name, Groups: []string{"system:nodes", "system:authenticated"}}
			b.nodeClients[name] = kubernetes.NewForConfigOrDie(c)
		}
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func waitFor(what string, timeout time.Duration, ok func() bool) {
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// job is one request to make, as the kubelet knows it: the pod and its projection.
type job struct {
	ns, pod, sa, node string
	podUID, saUID     types.UID
	nodeUID           types.UID
	keyType           string
	maxExpiration     *int32
}

// makePods creates the row's pods (through Splice's webhook) and waits until each is bound to a
// kwok node and Running; it returns one job per pod, read from the pod as created.
func (b *bench) makePods(ctx context.Context, row int) []job {
	start := time.Now()
	jobs := make([]job, b.o.pods)
	errs := make([]error, b.o.pods)
	parallel(b.o.pods, 16, func(k int) {
		ns, sa := nsName(k%b.o.namespaces), saName((k/b.o.namespaces)%b.o.accounts)
		no := false
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("id-%d-%d", row, k), Labels: map[string]string{"app": "bench-identity"}},
			Spec: corev1.PodSpec{
				ServiceAccountName:            sa,
				AutomountServiceAccountToken:  &no,
				NodeSelector:                  map[string]string{nodeLabel: "true"},
				TerminationGracePeriodSeconds: new(int64),
				Containers:                    []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}},
			},
		}
		got, err := b.admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			errs[k] = err
			return
		}
		proj := projection(got)
		if proj == nil || !strings.Contains(got.Annotations["splice.dev/status"], policyName) {
			errs[k] = fmt.Errorf("pod %s/%s was not injected (no podCertificate volume for %s or no splice.dev/status)", ns, got.Name, signer)
			return
		}
		jobs[k] = job{ns: ns, pod: got.Name, podUID: got.UID, sa: sa, saUID: b.saUIDs[ns+"/"+sa],
			keyType: proj.KeyType, maxExpiration: proj.MaxExpirationSeconds}
	})
	for _, err := range errs {
		if err != nil {
			fatalf("creating pods: %v", err)
		}
	}
	created := time.Since(start)
	// Bound and Running (kwok's pod-ready stage), read back for nodeName.
	index := map[string]int{}
	for k, j := range jobs {
		index[j.ns+"/"+j.pod] = k
	}
	waitFor("the pods bound to kwok nodes and Running", 10*time.Minute, func() bool {
		running := 0
		for i := 0; i < b.o.namespaces; i++ {
			list, err := b.admin.CoreV1().Pods(nsName(i)).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false
			}
			for _, p := range list.Items {
				k, ok := index[p.Namespace+"/"+p.Name]
				if !ok || p.Spec.NodeName == "" || p.Status.Phase != corev1.PodRunning {
					continue
				}
				jobs[k].node, jobs[k].nodeUID = p.Spec.NodeName, b.nodeUIDs[p.Spec.NodeName]
				running++
			}
		}
		return running == len(jobs)
	})
	logf("row %d: %d pods created (injected) in %.1f s, all bound and Running after %.1f s", row, len(jobs), created.Seconds(), time.Since(start).Seconds())
	return jobs
}

func projection(p *corev1.Pod) *corev1.PodCertificateProjection {
	for _, v := range p.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			if s.PodCertificate != nil && s.PodCertificate.SignerName == signer {
				return s.PodCertificate
			}
		}
	}
	return nil
}

func parallel(n, width int, f func(int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < width; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range next {
				f(k)
			}
		}()
	}
	for k := 0; k < n; k++ {
		next <- k
	}
	close(next)
	wg.Wait()
}

// keyAndProof: a fresh key of the projection's type, its SPKI (DER), and either the stub PKCS#10
// request the v1.36 kubelet sends (an empty template signed by the key) or the deprecated
// proof of possession over the pod UID.
func keyAndProof(keyType, form string, podUID types.UID) (spki, csr, pop []byte, err error) {
	var priv crypto.Signer
	switch keyType {
	case "ECDSAP256":
		priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case "ED25519":
		_, priv, err = ed25519.GenerateKey(rand.Reader)
	default:
		err = fmt.Errorf("key type %q is not one the bench makes", keyType)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	spki, err = x509.MarshalPKIXPublicKey(priv.Public())
	if err != nil {
		return nil, nil, nil, err
	}
	if form == "csr" {
		csr, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, priv)
		return spki, csr, nil, err
	}
	switch k := priv.(type) {
	case *ecdsa.PrivateKey:
		sum := sha256.Sum256([]byte(podUID))
		pop, err = ecdsa.SignASN1(rand.Reader, k, sum[:])
	case ed25519.PrivateKey:
		pop = ed25519.Sign(k, []byte(podUID))
	}
	return spki, nil, pop, err
}

// answer is what the watch saw of one request.
type answer struct {
	outcome string // Issued, Denied, Failed
	reason  string
	at      time.Time
	chain   string
}

type made struct {
	key      string // namespace/name
	job      job
	spki     []byte
	returned time.Time
}

// watcher follows every PodCertificateRequest from a resourceVersion on, recording the first
// terminal condition of each.
type watcher struct {
	mu      sync.Mutex
	answers map[string]answer
	notify  chan struct{}
}

func (b *bench) watch(ctx context.Context, w *watcher) {
	api := b.admin.CertificatesV1beta1().PodCertificateRequests("")
	list, err := api.List(ctx, metav1.ListOptions{})
	if err != nil {
		fatalf("listing PodCertificateRequests: %v", err)
	}
	rv := list.ResourceVersion
	ready := make(chan struct{})
	go func() {
		first := true
		for ctx.Err() == nil {
			wi, err := api.Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
			if first {
				close(ready)
				first = false
			}
			if err != nil {
				logf("watch: %v (again in 100 ms)", err)
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for ev := range wi.ResultChan() {
				now := time.Now()
				if ev.Type == watch.Error {
					if ctx.Err() != nil {
						break
					}
					logf("watch error: %v", apierrors.FromObject(ev.Object))
					if l, err := api.List(ctx, metav1.ListOptions{}); err == nil {
						rv = l.ResourceVersion
						for i := range l.Items {
							w.see(&l.Items[i], time.Now())
						}
					}
					break
				}
				pcr, ok := ev.Object.(*certsv1beta1.PodCertificateRequest)
				if !ok {
					continue
				}
				rv = pcr.ResourceVersion
				if ev.Type == watch.Added || ev.Type == watch.Modified {
					w.see(pcr, now)
				}
			}
			wi.Stop()
		}
	}()
	<-ready
}

func (w *watcher) see(pcr *certsv1beta1.PodCertificateRequest, at time.Time) {
	var a *answer
	for _, c := range pcr.Status.Conditions {
		if c.Status != metav1.ConditionTrue {
			continue
		}
		switch c.Type {
		case "Issued":
			if pcr.Status.CertificateChain != "" {
				a = &answer{outcome: "Issued", reason: c.Reason, at: at, chain: pcr.Status.CertificateChain}
			}
		case "Denied", "Failed":
			a = &answer{outcome: c.Type, reason: c.Reason + ": " + c.Message, at: at}
		}
	}
	if a == nil {
		return
	}
	key := pcr.Namespace + "/" + pcr.Name
	w.mu.Lock()
	if _, seen := w.answers[key]; !seen {
		w.answers[key] = *a
	}
	w.mu.Unlock()
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

func (b *bench) client(node string) *kubernetes.Clientset {
	if c, ok := b.nodeClients[node]; ok {
		return c
	}
	return b.admin
}

// row: fresh pods, then one request per pod, created `concurrency` at a time (at `rate` per
// second if not 0), then waits for every answer.
func (b *bench) row(ctx context.Context, t *table, row int, rate float64) {
	jobs := b.makePods(ctx, row)
	label := fmt.Sprintf("row %d (burst: %d in flight)", row+1, b.o.concurrency)
	if rate > 0 {
		label = fmt.Sprintf("row %d (paced: %g/s, at most %d in flight)", row+1, rate, b.o.concurrency)
	}
	// Let kwok's status writes and the leader's pod view settle before the window opens.
	time.Sleep(3 * time.Second)

	w := &watcher{answers: map[string]answer{}, notify: make(chan struct{}, 1)}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	b.watch(wctx, w)
	metricsBefore := scrape(b.o.admin)

	var mu sync.Mutex
	var mades []made
	var createErrs []string
	var keyTime time.Duration
	cpu0 := cpuSeconds(b.o.splicePID, b.o.clkTck)
	start := time.Now()
	var pace <-chan time.Time
	if rate > 0 {
		tk := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer tk.Stop()
		pace = tk.C
	}
	var wg sync.WaitGroup
	next := make(chan job)
	for i := 0; i < b.o.concurrency; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range next {
				k0 := time.Now()
				spki, csr, pop, err := keyAndProof(j.keyType, b.o.form, j.podUID)
				kd := time.Since(k0)
				if err != nil {
					fatalf("key for %s/%s: %v", j.ns, j.pod, err)
				}
				req := &certsv1beta1.PodCertificateRequest{
					ObjectMeta: metav1.ObjectMeta{
						Namespace: j.ns, GenerateName: "req-",
						OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: j.pod, UID: j.podUID}},
					},
					Spec: certsv1beta1.PodCertificateRequestSpec{
						SignerName: signer, PodName: j.pod, PodUID: j.podUID,
						ServiceAccountName: j.sa, ServiceAccountUID: j.saUID,
						NodeName: types.NodeName(j.node), NodeUID: j.nodeUID,
						MaxExpirationSeconds: j.maxExpiration,
						StubPKCS10Request:    csr, PKIXPublicKey: spki, ProofOfPossession: pop,
					},
				}
				if b.o.form == "csr" {
					req.Spec.PKIXPublicKey = nil
				}
				var got *certsv1beta1.PodCertificateRequest
				// As the kubelet's work queue would: a failed create is tried again (informer lag in
				// NodeRestriction says "not Forbidden" for that).
				for attempt := 0; ; attempt++ {
					got, err = b.client(j.node).CertificatesV1beta1().PodCertificateRequests(j.ns).Create(ctx, req, metav1.CreateOptions{})
					if err == nil || apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || attempt == 4 {
						break
					}
					time.Sleep(200 * time.Millisecond)
				}
				returned := time.Now()
				mu.Lock()
				keyTime += kd
				if err != nil {
					createErrs = append(createErrs, fmt.Sprintf("%s/%s: %v", j.ns, j.pod, err))
				} else {
					mades = append(mades, made{key: got.Namespace + "/" + got.Name, job: j, spki: spki, returned: returned})
				}
				mu.Unlock()
			}
		}()
	}
	for _, j := range jobs {
		if pace != nil {
			<-pace
		}
		next <- j
	}
	close(next)
	wg.Wait()
	createdAll := time.Since(start)
	if len(createErrs) > 0 {
		logf("%d creates failed; first: %s", len(createErrs), createErrs[0])
	}
	logf("%s: %d requests created in %.2f s (%.0f/s)", label, len(mades), createdAll.Seconds(), float64(len(mades))/createdAll.Seconds())

	// Every answer, or the timeout.
	deadline := time.After(b.o.timeout)
	progress := time.NewTicker(5 * time.Second)
	defer progress.Stop()
	answered := func() int {
		w.mu.Lock()
		defer w.mu.Unlock()
		n := 0
		for _, m := range mades {
			if _, ok := w.answers[m.key]; ok {
				n++
			}
		}
		return n
	}
wait:
	for answered() < len(mades) {
		select {
		case <-w.notify:
		case <-progress.C:
			logf("%s: %d of %d answered after %.0f s", label, answered(), len(mades), time.Since(start).Seconds())
		case <-deadline:
			logf("%s: timed out after %s", label, b.o.timeout)
			break wait
		}
	}
	w.mu.Lock()
	var last time.Time
	for _, m := range mades {
		if a, ok := w.answers[m.key]; ok && a.at.After(last) {
			last = a.at
		}
	}
	w.mu.Unlock()
	cpu1 := cpuSeconds(b.o.splicePID, b.o.clkTck)
	window := last.Sub(start)
	if last.IsZero() {
		window = time.Since(start)
	}
	rss, hwm := memory(b.o.splicePID)
	metricsAfter := scrape(b.o.admin)
	stop()

	// Outcomes, latencies, and the certificates checked.
	w.mu.Lock()
	defer w.mu.Unlock()
	var lat []float64
	counts := map[string]int{}
	reasons := map[string]int{}
	var times []time.Time
	badCert := 0
	var firstBad string
	early := 0
	for _, m := range mades {
		a, ok := w.answers[m.key]
		if !ok {
			counts["unanswered"]++
			continue
		}
		counts[a.outcome]++
		times = append(times, a.at)
		if a.outcome != "Issued" {
			reasons[a.outcome+" "+a.reason]++
			continue
		}
		d := a.at.Sub(m.returned)
		if d < 0 {
			early++
			d = 0
		}
		lat = append(lat, float64(d.Microseconds())/1000)
		if err := checkChain(a.chain, m); err != nil {
			badCert++
			if firstBad == "" {
				firstBad = err.Error()
			}
		}
	}
	sort.Float64s(lat)
	n := len(mades)
	per1000 := func(x float64) float64 { return x * 1000 / math.Max(float64(n), 1) }
	cpu := cpu1 - cpu0

	t.add(label+": requests created", fmt.Sprintf("%d in %.2f s (%.0f/s; key + CSR %.1f ms mean on the client)", n, createdAll.Seconds(), float64(n)/createdAll.Seconds(), keyTime.Seconds()*1000/math.Max(float64(n), 1)), fmt.Sprintf("%d", b.o.pods))
	t.add(label+": time until every request answered", fmt.Sprintf("%.2f s after the first create", window.Seconds()), "")
	t.add(label+": issuance latency p50 / p90 / p99 / max", fmt.Sprintf("%s / %s / %s / %s ms", ms(pct(lat, 50)), ms(pct(lat, 90)), ms(pct(lat, 99)), ms(pct(lat, 100))), "p99 ≤ 1,000 ms")
	t.add(label+": issued / denied / failed / unanswered / create errors", fmt.Sprintf("%d / %d / %d / %d / %d", counts["Issued"], counts["Denied"], counts["Failed"], counts["unanswered"], len(createErrs)), fmt.Sprintf("%d / 0 / 0 / 0 / 0", b.o.pods))
	if len(reasons) > 0 {
		var rs []string
		for r, c := range reasons {
			rs = append(rs, fmt.Sprintf("%d× %s", c, r))
		}
		sort.Strings(rs)
		t.add(label+": refusals", strings.Join(rs, "; "), "none")
	}
	if len(createErrs) > 0 {
		t.add(label+": first create error", createErrs[0], "none")
	}
	certNote := fmt.Sprintf("%d of %d issued chains with the pod's SPIFFE ID and the request's key", counts["Issued"]-badCert, counts["Issued"])
	if firstBad != "" {
		certNote += "; first bad: " + firstBad
	}
	t.add(label+": certificates checked", certNote, "all")
	batches, largest := batchesOf(times)
	t.add(label+": answers seen in bursts (gaps > 250 ms apart)", fmt.Sprintf("%d bursts, largest %d answers", batches, largest), "")
	if b.o.splicePID > 0 {
		t.add(label+": splice run's CPU per 1,000 requests", fmt.Sprintf("%.2f s (%.2f s over the %.1f s window; idle rate would be %.2f s of it)", per1000(cpu), cpu, window.Seconds(), b.idleRate*window.Seconds()), "")
		t.add(label+": splice run's memory after", fmt.Sprintf("VmRSS %.1f MiB, VmHWM %.1f MiB", rss, hwm), "")
	}
	if metricsBefore != nil && metricsAfter != nil {
		d := func(k string) float64 { return metricsAfter[k] - metricsBefore[k] }
		cnt := d("splice_identity_issuance_duration_seconds_count")
		mean := 0.0
		if cnt > 0 {
			mean = d("splice_identity_issuance_duration_seconds_sum") / cnt * 1000
		}
		t.add(label+": splice's own count (splice_identity_requests)", fmt.Sprintf("issued %.0f, denied %.0f, failed %.0f; mean creation→written %.0f ms (its histogram, creationTimestamp at 1 s resolution)",
			d(`splice_identity_requests_total{outcome="issued"}`), d(`splice_identity_requests_total{outcome="denied"}`), d(`splice_identity_requests_total{outcome="failed"}`), mean), "")
	}
	if early > 0 {
		logf("%d answers were seen before their create returned (counted as 0 ms)", early)
	}
}

// checkChain: the leaf names the pod's SPIFFE ID and certifies the request's key.
func checkChain(chain string, m made) error {
	block, _ := pem.Decode([]byte(chain))
	if block == nil {
		return errors.New("no PEM in certificateChain")
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return err
	}
	want := fmt.Sprintf("spiffe://%s/ns/%s/sa/%s", trustDomain, m.job.ns, m.job.sa)
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != want {
		return fmt.Errorf("%s: URI SANs %v, want %s", m.key, leaf.URIs, want)
	}
	if string(leaf.RawSubjectPublicKeyInfo) != string(m.spki) {
		return fmt.Errorf("%s: the leaf's key is not the request's", m.key)
	}
	return nil
}

// batchesOf: how many bursts the answers came in (answers less than 250 ms apart are one burst),
// and the largest: a signer answering once a tick shows one burst per tick.
func batchesOf(ts []time.Time) (int, int) {
	if len(ts) == 0 {
		return 0, 0
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	batches, size, largest := 1, 1, 1
	for i := 1; i < len(ts); i++ {
		if ts[i].Sub(ts[i-1]) > 250*time.Millisecond {
			batches++
			size = 0
		}
		size++
		largest = max(largest, size)
	}
	return batches, largest
}

// pct: nearest rank.
func pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func ms(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	if len(s) > 3 {
		s = s[:len(s)-3] + "," + s[len(s)-3:]
	}
	return s
}

func cpuSeconds(pid, clk int) float64 {
	if pid <= 0 {
		return 0
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	// Fields after the command: state is 3rd field of the line, utime the 14th, stime the 15th.
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / float64(clk)
}

func memory(pid int) (rss, hwm float64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 {
			continue
		}
		v, _ := strconv.ParseFloat(fs[1], 64)
		switch fs[0] {
		case "VmRSS:":
			rss = v / 1024
		case "VmHWM:":
			hwm = v / 1024
		}
	}
	return rss, hwm
}

// scrape: splice run's splice_identity_* samples.
func scrape(addr string) map[string]float64 {
	if addr == "" {
		return nil
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		logf("metrics: %v", err)
		return nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "splice_identity_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

func cpuNote() string {
	raw, _ := os.ReadFile("/proc/cpuinfo")
	n, model := 0, ""
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(l, "processor") {
			n++
		}
		if model == "" && strings.HasPrefix(l, "model name") {
			model = strings.TrimSpace(l[strings.IndexByte(l, ':')+1:])
		}
	}
	return fmt.Sprintf("%d CPUs (%s), shared", n, model)
}

func buildNote(bin string) string {
	switch {
	case strings.Contains(bin, "/release/"):
		return "release"
	case strings.Contains(bin, "/debug/"):
		return "debug"
	}
	return "given"
}

// table: the benchmark's markdown table, as the other benches print it.
type table struct{ rows [][3]string }

func (t *table) add(m, r, g string) {
	t.rows = append(t.rows, [3]string{m, r, g})
	logf("%s | %s | %s", m, r, g)
}

func (t *table) write(out string) {
	var sb strings.Builder
	sb.WriteString("| measurement | result | goal |\n|---|---|---|\n")
	for _, r := range t.rows {
		fmt.Fprintf(&sb, "| %s | %s | %s |\n", r[0], r[1], r[2])
	}
	fmt.Print(sb.String())
	if out != "" {
		if err := os.WriteFile(out, []byte(sb.String()), 0o644); err != nil {
			fatalf("writing %s: %v", out, err)
		}
	}
}
