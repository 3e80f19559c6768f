// Package deploy holds the Kubernetes manifests (kubernetes/) and the image
// (Dockerfile) of nprdma. No cluster is at hand where the tests run, so
// TestManifests checks what can be checked without one.
package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// object is one Kubernetes object, as a YAML tree.
type object struct {
	file string
	doc  map[string]any
}

func (o object) kind() string { return str(o.doc, "kind") }
func (o object) name() string { return str(o.doc, "metadata", "name") }
func (o object) String() string {
	return fmt.Sprintf("%s %s (%s)", o.kind(), o.name(), o.file)
}

// get walks a path of map keys.
func get(v any, path ...string) any {
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func str(v any, path ...string) string { s, _ := get(v, path...).(string); return s }
func list(v any, path ...string) []any { l, _ := get(v, path...).([]any); return l }

func load(t *testing.T) []object {
	t.Helper()
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	var out []object
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for i := 0; ; i++ {
			var doc map[string]any
			err := dec.Decode(&doc)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			if doc != nil {
				out = append(out, object{file: filepath.Base(f), doc: doc})
			}
		}
	}
	return out
}

// TestManifests: every document is YAML with apiVersion, kind and a name;
// namespaced objects are in the driver's namespace; workloads select their
// own pods, name every container and its image, and mount only volumes
// they declare; secret volumes are owner-only (the token file must be);
// service accounts and the roles bindings name exist; the driver name
// agrees between the CSIDriver, the StorageClass and the node registrar;
// the four upstream sidecars are there; kustomization lists every file.
func TestManifests(t *testing.T) {
	objs := load(t)
	byKind := map[string][]object{}
	for _, o := range objs {
		if str(o.doc, "apiVersion") == "" || o.kind() == "" || (o.name() == "" && o.kind() != "Kustomization") {
			t.Errorf("%s: apiVersion, kind and metadata.name are required", o)
		}
		byKind[o.kind()] = append(byKind[o.kind()], o)
	}
	has := func(kind, name string) bool {
		return slices.ContainsFunc(byKind[kind], func(o object) bool { return o.name() == name })
	}
	clusterScoped := []string{"Namespace", "ClusterRole", "ClusterRoleBinding", "CSIDriver", "StorageClass", "Kustomization"}
	for _, o := range objs {
		if !slices.Contains(clusterScoped, o.kind()) && str(o.doc, "metadata", "namespace") != "nprdma" {
			t.Errorf("%s: not in namespace nprdma", o)
		}
	}

	images := map[string]bool{}
	for _, kind := range []string{"Deployment", "DaemonSet", "StatefulSet"} {
		for _, o := range byKind[kind] {
			sel, _ := get(o.doc, "spec", "selector", "matchLabels").(map[string]any)
			labels, _ := get(o.doc, "spec", "template", "metadata", "labels").(map[string]any)
			if len(sel) == 0 {
				t.Errorf("%s: no spec.selector.matchLabels", o)
			}
			for k, v := range sel {
				if labels[k] != v {
					t.Errorf("%s: selector %s=%v does not match the pod template's labels", o, k, v)
				}
			}
			pod := get(o.doc, "spec", "template", "spec")
			if sa := str(pod, "serviceAccountName"); sa != "" && !has("ServiceAccount", sa) {
				t.Errorf("%s: service account %s is not defined", o, sa)
			}
			volumes := map[string]any{}
			for _, v := range list(pod, "volumes") {
				volumes[str(v, "name")] = v
				if s := get(v, "secret"); s != nil {
					if mode, _ := get(s, "defaultMode").(int); mode&0o077 != 0 || mode == 0 {
						t.Errorf("%s: secret volume %s: defaultMode %#o, want owner-only (the token file must be)", o, str(v, "name"), mode)
					}
				}
			}
			containers := list(pod, "containers")
			if len(containers) == 0 {
				t.Errorf("%s: no containers", o)
			}
			for _, c := range containers {
				if str(c, "name") == "" || str(c, "image") == "" {
					t.Errorf("%s: a container without a name or an image", o)
				}
				images[str(c, "image")] = true
				for _, m := range list(c, "volumeMounts") {
					if _, ok := volumes[str(m, "name")]; !ok {
						t.Errorf("%s: container %s mounts undeclared volume %s", o, str(c, "name"), str(m, "name"))
					}
					if str(m, "mountPath") == "" {
						t.Errorf("%s: container %s: a mount without a path", o, str(c, "name"))
					}
				}
			}
		}
	}
	for _, sidecar := range []string{"csi-provisioner", "csi-attacher", "csi-resizer", "csi-node-driver-registrar"} {
		found := false
		for img := range images {
			found = found || strings.Contains(img, "/sig-storage/"+sidecar+":")
		}
		if !found {
			t.Errorf("no %s sidecar", sidecar)
		}
	}
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		for _, o := range byKind[kind] {
			ref := strings.TrimSuffix(kind, "Binding")
			if str(o.doc, "roleRef", "kind") != ref || !has(ref, str(o.doc, "roleRef", "name")) {
				t.Errorf("%s: roleRef %s %s is not defined", o, str(o.doc, "roleRef", "kind"), str(o.doc, "roleRef", "name"))
			}
			for _, s := range list(o.doc, "subjects") {
				if str(s, "kind") == "ServiceAccount" && !has("ServiceAccount", str(s, "name")) {
					t.Errorf("%s: subject %s is not defined", o, str(s, "name"))
				}
			}
		}
	}
	if len(byKind["CSIDriver"]) != 1 || len(byKind["StorageClass"]) == 0 {
		t.Fatalf("want one CSIDriver and a StorageClass, have %d and %d", len(byKind["CSIDriver"]), len(byKind["StorageClass"]))
	}
	driver := byKind["CSIDriver"][0].name()
	for _, sc := range byKind["StorageClass"] {
		if p := str(sc.doc, "provisioner"); p != driver {
			t.Errorf("%s: provisioner %s, the CSIDriver is %s", sc, p, driver)
		}
		if get(sc.doc, "allowVolumeExpansion") != true {
			t.Errorf("%s: volumes can grow: allowVolumeExpansion should be true", sc)
		}
	}
	registrar := false
	for _, o := range byKind["DaemonSet"] {
		for _, c := range list(o.doc, "spec", "template", "spec", "containers") {
			for _, a := range list(c, "args") {
				if s, _ := a.(string); strings.HasPrefix(s, "--kubelet-registration-path=") {
					registrar = true
					if !strings.Contains(s, "/plugins/"+driver+"/") {
						t.Errorf("%s: %s does not name the driver %s", o, s, driver)
					}
				}
			}
		}
	}
	if !registrar {
		t.Error("no node-driver-registrar with --kubelet-registration-path")
	}
	if !has("ConfigMap", "nprdma-csi-targets") || !strings.Contains(str(byKind["ConfigMap"][0].doc, "data", "targets.json"), `"targets"`) {
		t.Error("no ConfigMap nprdma-csi-targets with targets.json")
	}

	files, _ := filepath.Glob("kubernetes/*.yaml")
	var listed []string
	for _, o := range byKind["Kustomization"] {
		for _, r := range list(o.doc, "resources") {
			listed = append(listed, fmt.Sprint(r))
		}
	}
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" && !slices.Contains(listed, b) {
			t.Errorf("kustomization.yaml does not list %s", b)
		}
	}
}

// TestStorageClassSecrets: a StorageClass that names DH-HMAC-CHAP key files
// names a node-stage Secret too, and the other way round; the Secret is
// defined, in the namespace named, with the keys the node plugin reads
// (dhchapSecret, and dhchapCtrlSecret with a controller key file); and
// each key file is that Secret's key of the same name as the targets'
// containers mount it, so that the targets and the nodes hold the same
// secrets.
func TestStorageClassSecrets(t *testing.T) {
	objs := load(t)
	secrets := map[string]map[string]any{} // by namespace/name: the keys
	for _, o := range objs {
		if o.kind() == "Secret" {
			keys, _ := get(o.doc, "stringData").(map[string]any)
			if keys == nil {
				keys, _ = get(o.doc, "data").(map[string]any)
			}
			secrets[str(o.doc, "metadata", "namespace")+"/"+o.name()] = keys
		}
	}
	// targetMounts: the Secret each nprdma-target container mounts, by
	// mount path (the Secret's namespace/name).
	targetMounts := map[string]string{}
	for _, o := range objs {
		pod := get(o.doc, "spec", "template", "spec")
		for _, c := range list(pod, "containers") {
			if cmd := list(c, "command"); len(cmd) == 0 || !strings.HasSuffix(fmt.Sprint(cmd[0]), "/nprdma-target") {
				continue
			}
			for _, m := range list(c, "volumeMounts") {
				for _, v := range list(pod, "volumes") {
					if str(v, "name") == str(m, "name") && str(v, "secret", "secretName") != "" {
						targetMounts[str(m, "mountPath")] = str(o.doc, "metadata", "namespace") + "/" + str(v, "secret", "secretName")
					}
				}
			}
		}
	}
	classes := 0
	for _, sc := range objs {
		if sc.kind() != "StorageClass" {
			continue
		}
		params := get(sc.doc, "parameters")
		secret := str(params, "csi.storage.k8s.io/node-stage-secret-namespace") + "/" + str(params, "csi.storage.k8s.io/node-stage-secret-name")
		files := map[string]string{"dhchapSecret": str(params, "dhchapKeyFile"), "dhchapCtrlSecret": str(params, "dhchapCtrlKeyFile")}
		if secret == "/" && files["dhchapSecret"] == "" && files["dhchapCtrlSecret"] == "" {
			continue
		}
		classes++
		if secret == "/" || files["dhchapSecret"] == "" {
			t.Errorf("%s: key files and a node-stage secret go together (%s, dhchapKeyFile %q)", sc, secret, files["dhchapSecret"])
			continue
		}
		keys, ok := secrets[secret]
		if !ok {
			t.Errorf("%s: node-stage secret %s is not defined", sc, secret)
			continue
		}
		for key, file := range files {
			if file == "" {
				continue
			}
			if _, ok := keys[key]; !ok {
				t.Errorf("%s: secret %s has no key %s", sc, secret, key)
			}
			if filepath.Base(file) != key || targetMounts[filepath.Dir(file)] != secret {
				t.Errorf("%s: key file %s is not the key %s of %s as a target mounts it (targets mount %v)", sc, file, key, secret, targetMounts)
			}
		}
	}
	if classes == 0 {
		t.Error("no StorageClass with DH-HMAC-CHAP secrets")
	}
}
