package egress

import (
	"errors"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"carehub/kernel/fault"
)

func TestPublicAddr(t *testing.T) {
	for _, tc := range []struct {
		ip     string
		public bool
	}{
		{"93.184.215.14", true},
		{"2606:2800:21f:cb07:6820:80da:af6b:8b2c", true},
		{"127.0.0.1", false},
		{"127.8.9.10", false},
		{"::1", false},
		{"10.0.0.1", false},
		{"172.16.5.4", false},
		{"192.168.1.1", false},
		{"169.254.169.254", false}, // cloud metadata
		{"fe80::1", false},
		{"fc00::1", false},
		{"0.0.0.0", false},
		{"::", false},
		{"100.64.0.1", false}, // CGNAT
		{"100.127.255.254", false},
		{"224.0.0.1", false},
		{"ff02::1", false},
		{"255.255.255.255", false},
		{"::ffff:127.0.0.1", false}, // IPv4-mapped loopback
		{"::ffff:8.8.8.8", true},
		{"64:ff9b::a00:1", false}, // NAT64 of 10.0.0.1
		{"64:ff9b::808:808", true},
		{"2002:7f00:1::", false}, // 6to4 of 127.0.0.1
		{"198.18.0.1", false},
	} {
		if got := PublicAddr(netip.MustParseAddr(tc.ip)); got != tc.public {
			t.Errorf("PublicAddr(%s) = %v, want %v", tc.ip, got, tc.public)
		}
	}
}

// TestCheckURL: the URLs a destination may not have are 422s on the field "url"; a public
// https URL passes, and with allowPrivate so do http and private or loopback hosts.
func TestCheckURL(t *testing.T) {
	for _, u := range []string{
		"http://example.com/hook",
		"https://127.0.0.1/hook",
		"https://localhost:8443/hook",
		"https://api.localhost/hook",
		"https://[::1]/hook",
		"https://10.1.2.3/hook",
		"https://169.254.169.254/latest/meta-data",
		"https://100.64.0.1/hook",
		"https://0.0.0.0/hook",
		"https://[::ffff:127.0.0.1]/hook",
		"https://2130706433/hook",
		"https://0x7f.1/hook",
		"https://user:pw@example.com/hook",
		"https://example.com/hook#frag",
		"ftp://example.com/",
		"/relative",
		"",
		"https://example.com/" + strings.Repeat("a", MaxURLLength),
	} {
		err := CheckURL(u, false)
		var f *fault.Error
		if fault.KindOf(err) != fault.KindValidation || !errors.As(err, &f) || urlField(f) == "" {
			t.Errorf("CheckURL(%q) = %v, want a validation error on url", u, err)
		}
	}
	for _, u := range []string{"https://hooks.example.com/carehub", "https://8.8.8.8/", "https://[2001:4860:4860::8888]/"} {
		if err := CheckURL(u, false); err != nil {
			t.Errorf("CheckURL(%q) = %v", u, err)
		}
	}
	for _, u := range []string{"http://127.0.0.1:8080/hook", "https://localhost/", "https://10.1.2.3/"} {
		if err := CheckURL(u, true); err != nil {
			t.Errorf("CheckURL(%q, allowPrivate) = %v", u, err)
		}
	}
}

// urlField returns the message a validation error carries for the field "url".
func urlField(f *fault.Error) string {
	fields, _ := f.Details["fields"].(map[string]any)
	s, _ := fields["url"].(string)
	return s
}

func TestDialControl(t *testing.T) {
	for _, a := range []string{"127.0.0.1:443", "[::1]:443", "10.0.0.1:80", "169.254.169.254:80", "not an address"} {
		if err := DialControl("tcp", a, nil); !errors.Is(err, ErrForbidden) {
			t.Errorf("DialControl(%s) = %v, want ErrForbidden", a, err)
		}
	}
	if err := DialControl("tcp", "93.184.215.14:443", nil); err != nil {
		t.Errorf("DialControl(public) = %v", err)
	}
}

// FuzzCheckURL feeds arbitrary strings to the URL check. Whatever it accepts without
// allowPrivate is an absolute https URL with a host, no credentials and no fragment, at most
// MaxURLLength bytes, and names no loopback host and no literal address that is not public; the
// same URL passes with allowPrivate. Every refusal is a 422.
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
		err := CheckURL(raw, false)
		if err != nil {
			if fault.KindOf(err) != fault.KindValidation {
				t.Fatalf("refusal of %q is %v, not a 422", raw, err)
			}
			return
		}
		u, perr := url.Parse(raw)
		if perr != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || strings.Contains(raw, "#") || len(raw) > MaxURLLength {
			t.Fatalf("accepted %q", raw)
		}
		host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
		if host == "localhost" || strings.HasSuffix(host, ".localhost") {
			t.Fatalf("accepted loopback name %q", raw)
		}
		if ip, err := netip.ParseAddr(host); err == nil && !PublicAddr(ip) {
			t.Fatalf("accepted non-public address %q", raw)
		}
		if err := CheckURL(raw, true); err != nil {
			t.Fatalf("%q passes without allowPrivate but not with it: %v", raw, err)
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
