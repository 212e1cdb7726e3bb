package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"carehub/e2e/pipelinetest"
)

// HTTPS receivers (-tls-dir): production receivers are https, and a node offers them HTTP/2. The
// receivers (the subscriptions' and the raw baseline's) serve one certificate for 127.0.0.1
// that webhookload makes in the directory on its first use; the node trusts it when started with
// --webhooks-ca-file DIR/receiver.pem.

// receiverTLS is the receivers' certificate and protocols, and the pool that trusts it.
type receiverTLS struct {
	certFile string
	cert     tls.Certificate
	roots    *x509.CertPool
	h1       bool // offer only HTTP/1.1
}

// loadReceiverTLS reads dir's receiver certificate, making it first if dir has none.
func loadReceiverTLS(dir string, h1 bool) (*receiverTLS, error) {
	certFile, keyFile := filepath.Join(dir, "receiver.pem"), filepath.Join(dir, "receiver-key.pem")
	if _, err := os.Stat(certFile); errors.Is(err, fs.ErrNotExist) {
		if err := makeReceiverCert(certFile, keyFile); err != nil {
			return nil, fmt.Errorf("make the receivers' certificate in %s: %w", dir, err)
		}
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	return &receiverTLS{certFile: certFile, cert: cert, roots: roots, h1: h1}, nil
}

// makeReceiverCert writes a self-signed ECDSA certificate for 127.0.0.1, ::1 and localhost, valid
// for a year, and its key.
func makeReceiverCert(certFile, keyFile string) error {
	if err := os.MkdirAll(filepath.Dir(certFile), 0o700); err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "webhookload receiver"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().AddDate(1, 0, 0),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

// scheme is the receivers' URL scheme.
func (rt *receiverTLS) scheme() string {
	if rt == nil {
		return "http"
	}
	return "https"
}

// protocol names what the receivers offer, for the report.
func (rt *receiverTLS) protocol() string {
	switch {
	case rt == nil:
		return "http/1.1 (plain)"
	case rt.h1:
		return "http/1.1 over TLS"
	}
	return "h2 over TLS (http/1.1 offered too)"
}

// serve serves srv on ln, over TLS when rt is set.
func (rt *receiverTLS) serve(srv *http.Server, ln net.Listener) {
	if rt == nil {
		_ = srv.Serve(ln)
		return
	}
	srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{rt.cert}, MinVersion: tls.VersionTLS12}
	if rt.h1 {
		srv.TLSConfig.NextProtos = []string{"http/1.1"}
		srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){} // no h2
	}
	_ = srv.ServeTLS(ln, "", "")
}

// transport is a client transport for the raw baseline that, like carehub's sender, offers
// HTTP/2 over TLS and keeps conns connections alive.
func (rt *receiverTLS) transport(conns int) *http.Transport {
	tr := &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns, IdleConnTimeout: time.Minute, ForceAttemptHTTP2: true}
	if rt != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: rt.roots, MinVersion: tls.VersionTLS12}
	}
	return tr
}

// checkTrusted asks the node for a test send to the receivers' probe path: a node not started
// with --webhooks-ca-file naming rt's certificate fails it, and the run would deliver nothing.
func (rt *receiverTLS) checkTrusted(ctx context.Context, admin *pipelinetest.Client, base string) error {
	if rt == nil {
		return nil
	}
	var res struct {
		Success bool
		Error   *string
	}
	if err := admin.REST(ctx, http.MethodPost, "/api/v1/webhooks/test", map[string]string{"url": base + probePath}, &res); err != nil {
		return fmt.Errorf("test send to the receiver: %w", err)
	}
	if !res.Success {
		why := "no answer"
		if res.Error != nil {
			why = *res.Error
		}
		return fmt.Errorf("the node cannot reach the HTTPS receiver (%s): start it with --webhooks-ca-file %s", why, rt.certFile)
	}
	return nil
}

// probePath answers 204 to checkTrusted's test send.
const probePath = "/probe"
