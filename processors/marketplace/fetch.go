package marketplace

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"time"

	"carehub/kernel/egress"
	"carehub/kernel/fault"
)

// FetchTimeout bounds the download of a model from its URL, connection to last byte.
const FetchTimeout = 60 * time.Second

// sha256Hex is a SHA-256 digest as the publisher gives it: 64 lowercase hex digits.
var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// fetchClient downloads models: to public addresses only unless allowPrivate (the webhook rule),
// following at most three redirects, each checked by the same rule.
func fetchClient(allowPrivate bool) *http.Client {
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	if !allowPrivate {
		dialer.Control = egress.DialControl
	}
	return &http.Client{
		Timeout: FetchTimeout,
		Transport: egress.Guard(&http.Transport{DialContext: dialer.DialContext, TLSHandshakeTimeout: 10 * time.Second,
			ResponseHeaderTimeout: 30 * time.Second, MaxResponseHeaderBytes: egress.MaxAnswerHeaderBytes}),
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 3 {
				return errors.New("more than 3 redirects")
			}
			return egress.CheckURL(req.URL.String(), allowPrivate)
		},
	}
}

// AttachModelFrom is AttachModel for a file carehub downloads from rawURL (https, and a public
// address unless the node allows private ones), pinned by wantSHA256: a file whose digest
// differs is refused, so what the reviewer approves is the file the publisher named, whatever
// the URL serves later. The download is bounded by MaxModelBytes and FetchTimeout; a URL that
// cannot be fetched is a Validation fault naming the cause.
func (s *Service) AttachModelFrom(ctx context.Context, assetID, rawURL, wantSHA256 string) (_ *ModelArtifact, created bool, err error) {
	bad := map[string]string{}
	if err := egress.CheckURL(rawURL, s.allowPriv); err != nil {
		fields, _ := fault.As(err).Details["fields"].(map[string]any)
		bad["url"] = fmt.Sprint(fields["url"])
	}
	if !sha256Hex.MatchString(wantSHA256) {
		bad["sha256"] = "the file's SHA-256: 64 lowercase hex digits"
	}
	if len(bad) > 0 {
		return nil, false, fault.Validation("invalid model source", bad)
	}
	p, err := s.mayAttach(ctx, assetID)
	if err != nil {
		return nil, false, err
	}
	content, err := s.download(ctx, rawURL)
	if err != nil {
		return nil, false, err
	}
	sum := sha256.Sum256(content)
	if got := hex.EncodeToString(sum[:]); got != wantSHA256 {
		return nil, false, fault.Validation("the file at url is not the one named", map[string]string{
			"sha256": fmt.Sprintf("the file at url has SHA-256 %s, not %s", got, wantSHA256)})
	}
	return s.attach(ctx, p, assetID, content, &rawURL)
}

// download reads the body at rawURL, at most MaxModelBytes.
func (s *Service) download(ctx context.Context, rawURL string) ([]byte, error) {
	unfetchable := func(why string) error {
		return fault.Validation("the model could not be fetched", map[string]string{"url": why})
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return nil, unfetchable(err.Error())
	}
	resp, err := s.fetch.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if ue, ok := errors.AsType[*url.Error](err); ok {
			err = ue.Err // the cause, without the URL (which may carry a token in its query)
		}
		return nil, unfetchable("GET failed: " + err.Error())
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, unfetchable(fmt.Sprintf("GET answered HTTP %d", resp.StatusCode))
	}
	if resp.ContentLength > MaxModelBytes {
		return nil, fault.New(fault.KindTooLarge, "the file at url is %d bytes; a model file is at most %d MiB", resp.ContentLength, MaxModelBytes>>20)
	}
	content, err := io.ReadAll(io.LimitReader(resp.Body, MaxModelBytes+1))
	if err != nil {
		return nil, unfetchable("reading the body failed: " + err.Error())
	}
	if len(content) > MaxModelBytes {
		return nil, fault.New(fault.KindTooLarge, "the file at url is larger than %d MiB, the most a model file may be", MaxModelBytes>>20)
	}
	return content, nil
}
