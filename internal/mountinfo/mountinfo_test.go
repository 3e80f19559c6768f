package mountinfo

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

const sample = `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
36 22 7:3 / /mnt/with\040space rw,relatime - ext4 /dev/loop3 rw
37 22 0:51 / /tmp/nprdma-fuse-1 rw,nosuid,nodev,relatime shared:7 master:2 - fuse.nprdma nprdma rw,user_id=0
38 22 7:3 /sub /srv/again rw - ext4 /dev/loop3 rw
39 22 0:60 / /run/empty-source rw - tmpfs  rw
40 22 0:61 / /a\134b\011c rw - fuse.x back\040slash rw
`

func TestParse(t *testing.T) {
	got, err := Parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	want := []Entry{
		{ID: 22, ParentID: 1, Major: 8, Minor: 1, Root: "/", MountPoint: "/", FSType: "ext4", Source: "/dev/sda1"},
		{ID: 36, ParentID: 22, Major: 7, Minor: 3, Root: "/", MountPoint: "/mnt/with space", FSType: "ext4", Source: "/dev/loop3"},
		{ID: 37, ParentID: 22, Major: 0, Minor: 51, Root: "/", MountPoint: "/tmp/nprdma-fuse-1", FSType: "fuse.nprdma", Source: "nprdma"},
		{ID: 38, ParentID: 22, Major: 7, Minor: 3, Root: "/sub", MountPoint: "/srv/again", FSType: "ext4", Source: "/dev/loop3"},
		{ID: 39, ParentID: 22, Major: 0, Minor: 60, Root: "/", MountPoint: "/run/empty-source", FSType: "tmpfs", Source: ""},
		{ID: 40, ParentID: 22, Major: 0, Minor: 61, Root: "/", MountPoint: "/a\\b\tc", FSType: "fuse.x", Source: "back slash"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("parsed\n%+v\nwant\n%+v", got, want)
	}
	if d := got[1].Dev(); d != unix.Mkdev(7, 3) || d != 7<<8|3 {
		t.Errorf("Dev of 7:3 = %#x", d)
	}
	if p := PointsOf(got, unix.Mkdev(7, 3)); !slices.Equal(p, []string{"/mnt/with space", "/srv/again"}) {
		t.Errorf("PointsOf(7:3) = %q", p)
	}
	if p := PointsOf(got, unix.Mkdev(9, 9)); p != nil {
		t.Errorf("PointsOf(9:9) = %q, want none", p)
	}
	if got, err := Parse(strings.NewReader("")); err != nil || len(got) != 0 {
		t.Errorf("empty table: %v %v", got, err)
	}
}

// TestParseRefusesMalformed: every line that is not mountinfo fails the
// parse with an error naming the line.
func TestParseRefusesMalformed(t *testing.T) {
	good := "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
	for bad, want := range map[string]string{
		"garbage line":                               "malformed line",
		"1 2\n":                                      "malformed line",
		"1 2 x / /a rw - ext4 src rw":                `bad device "x"`,
		"1 2 8 / /a rw - ext4 src rw":                `bad device "8"`,
		"1 2 8:x / /a rw - ext4 src rw":              `bad device "8:x"`,
		"1 2 -8:1 / /a rw - ext4 src rw":             `bad device "-8:1"`,
		"1 2 4294967296:1 / /a rw - ext4 src rw":     `bad device "4294967296:1"`,
		"a 2 8:1 / /a rw - ext4 src rw":              "mount IDs",
		"1 2 8:1 / /a rw shared:1 ext4 src rw":       "malformed line", // no separator
		"1 2 8:1 / /a rw - ext4":                     "malformed line", // no source
		"1 2 8:1 / /a - ext4 src rw":                 "malformed line", // the separator in OPTIONS' place
		"1 2 8:1 /  rw - ext4 src rw":                "empty mount point",
		"1 2 8:1 / /a rw -  src rw":                  "empty mount point or filesystem type",
		"1  2 8:1 / /a rw - ext4 src rw":             "mount IDs", // two spaces shift the fields
		"1 2 8:1 / /a rw - ext4 src rw\n\n":          "malformed line",
		strings.Repeat("x", maxLine+1):               "too long",
		"1 2 8:1 / /a rw - ext4 src rw\n1 2 3 4 5 6": "mountinfo line 3:", // the good line, this one, then the bad
	} {
		got, err := Parse(strings.NewReader(good + bad))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%.60q) = %v, %v; want an error containing %q", bad, got, err, want)
		}
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		"/plain":              "/plain",
		`/a\040b`:             "/a b",
		`\011\012\134`:        "\t\n\\",
		`/trailing\04`:        `/trailing\04`, // too short to be an escape
		`/not\999octal`:       `/not\999octal`,
		`/too\777big`:         `/too\777big`, // above a byte
		`\134040`:             `\040`,        // an escaped backslash followed by digits
		`/end\`:               `/end\`,
		`\040\040`:            "  ",
		"/utf8-\u00e9t\u00e9": "/utf8-\u00e9t\u00e9",
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestReadThisProcess reads the real table: "/" is mounted, every entry's
// device finds its own mount point, and a fresh directory is no mount
// point.
func TestReadThisProcess(t *testing.T) {
	if _, err := os.Stat(Path); err != nil {
		t.Skipf("no %s (not Linux with /proc): %v", Path, err)
	}
	mounts, err := Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) == 0 {
		t.Fatal("no mounts")
	}
	for _, m := range mounts[:min(len(mounts), 5)] {
		points, err := MountPointsOf(m.Dev())
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(points, m.MountPoint) {
			t.Errorf("MountPointsOf(%d:%d) = %q, lacks %s", m.Major, m.Minor, points, m.MountPoint)
		}
	}
	if ok, err := IsMountPoint("/"); err != nil || !ok {
		t.Errorf("IsMountPoint(/) = %v, %v", ok, err)
	}
	if ok, err := IsMountPoint(t.TempDir()); err != nil || ok {
		t.Errorf("IsMountPoint(a fresh temporary directory) = %v, %v", ok, err)
	}
}

// format writes entries in the kernel's format, escaping as it does; the
// fuzz test checks that Parse reads back what it wrote.
func format(entries []Entry) string {
	esc := strings.NewReplacer(" ", `\040`, "\t", `\011`, "\n", `\012`, `\`, `\134`)
	var b strings.Builder
	for _, e := range entries {
		b.WriteString(strconv.Itoa(e.ID) + " " + strconv.Itoa(e.ParentID) + " " +
			strconv.FormatUint(uint64(e.Major), 10) + ":" + strconv.FormatUint(uint64(e.Minor), 10) + " " +
			esc.Replace(e.Root) + " " + esc.Replace(e.MountPoint) + " rw shared:1 - " +
			esc.Replace(e.FSType) + " " + esc.Replace(e.Source) + " rw\n")
	}
	return b.String()
}

func TestFormatRoundTrip(t *testing.T) {
	mounts, err := Parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse(strings.NewReader(format(mounts)))
	if err != nil || !slices.Equal(again, mounts) {
		t.Fatalf("round trip: %+v, %v", again, err)
	}
}
