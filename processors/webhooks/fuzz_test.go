package webhooks

import (
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"carehub/kernel/fault"
)

// FuzzCheckURL feeds arbitrary strings to the subscription URL check. Whatever it accepts
// without AllowPrivate is an absolute https URL with a host, no credentials and no fragment, at
// most 2048 bytes, and names no loopback host and no literal address that is not public; the
// same URL passes with AllowPrivate. Every refusal is a 422.
func FuzzCheckURL(f *testing.F) {
	for _, s := range []string{"https://hooks.example.org/carehub", "http://hooks.example.org/x", "https://127.0.0.1/x",
		"https://[::1]/x", "https://[::ffff:127.0.0.1]/", "https://10.0.0.1/", "https://169.254.169.254/latest/meta-data",
		"https://localhost/", "https://a.localhost./", "https://2130706433/", "https://0x7f.1/", "https://127.1/",
		"https://user:pass@example.org/", "https://example.org/#frag", "https://example.org/%00", "https://exa\x00mple.org/",
		"https://[64:ff9b::7f00:1]/", "https://[2002:7f00:1::]/", "https://100.64.0.1/", "https://0.0.0.0/", "https:///x",
		"https:example.org", "//example.org", "", "ftp://example.org/", "https://example.org:99999/", "HTTPS://EXAMPLE.ORG/",
		"https://[fe80::1%25eth0]/", "https://8.8.8.8/", "https://[2001:4860:4860::8888]/", "https://example.org/" + strings.Repeat("a", 2100)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		err := checkURL(raw, false)
		if err != nil {
			if fault.KindOf(err) != fault.KindValidation {
				t.Fatalf("refusal of %q is %v, not a 422", raw, err)
			}
			return
		}
		u, perr := url.Parse(raw)
		if perr != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || strings.Contains(raw, "#") || len(raw) > maxURLLength {
			t.Fatalf("accepted %q", raw)
		}
		host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
		if host == "localhost" || strings.HasSuffix(host, ".localhost") {
			t.Fatalf("accepted loopback name %q", raw)
		}
		if ip, err := netip.ParseAddr(host); err == nil && !PublicAddr(ip) {
			t.Fatalf("accepted non-public address %q", raw)
		}
		if err := checkURL(raw, true); err != nil {
			t.Fatalf("%q passes without AllowPrivate but not with it: %v", raw, err)
		}
	})
}

// FuzzPublicAddr checks PublicAddr against the standard library's classification for any
// address, including IPv4-mapped, NAT64 and 6to4 forms of the IPv4 ones.
func FuzzPublicAddr(f *testing.F) {
	for _, s := range []string{"8.8.8.8", "127.0.0.1", "10.1.2.3", "169.254.169.254", "::1", "::ffff:127.0.0.1",
		"64:ff9b::7f00:1", "2002:7f00:1::", "2001:4860:4860::8888", "fe80::1", "100.64.0.1", "255.255.255.255"} {
		a := netip.MustParseAddr(s).As16()
		f.Add(a[:])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) != 16 {
			return
		}
		ip := netip.AddrFrom16([16]byte(b))
		if !PublicAddr(ip) {
			return
		}
		u := ip.Unmap()
		if u.IsLoopback() || u.IsPrivate() || u.IsLinkLocalUnicast() || u.IsMulticast() || u.IsUnspecified() {
			t.Fatalf("%s is public", ip)
		}
		for _, p := range forbiddenPrefixes {
			if p.Contains(u) {
				t.Fatalf("%s in %s is public", ip, p)
			}
		}
	})
}
