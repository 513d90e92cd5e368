{{/*
Names and labels shared by every template.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "chunktune.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The full name of the release's objects: fullnameOverride, else "<release>-<name>", or just the
release name when it already contains the chart name (so `helm install chunktune ...` gives
"chunktune", not "chunktune-chunktune"). Truncated to 63 characters (DNS label).
*/}}
{{- define "chunktune.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "<chart>-<version>" for the helm.sh/chart label. */}}
{{- define "chunktune.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The labels that select the operator pod; never change them (Deployment selectors are immutable). */}}
{{- define "chunktune.selectorLabels" -}}
app.kubernetes.io/name: {{ include "chunktune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object of the release. */}}
{{- define "chunktune.labels" -}}
helm.sh/chart: {{ include "chunktune.chart" . }}
{{ include "chunktune.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: chunktune
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/*
User labels (list . MAP) minus the keys "chunktune.labels" already sets: the chart's own labels
win, because the operator pod's are its Deployment's (immutable) selector.
*/}}
{{- define "chunktune.extraLabels" -}}
{{- $base := include "chunktune.labels" (index . 0) | fromYaml -}}
{{- range $k, $v := index . 1 }}
{{- if not (hasKey $base $k) }}
{{ $k }}: {{ $v | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The operator's ServiceAccount name. */}}
{{- define "chunktune.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "chunktune.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The chunktune image, used by the operator and (CHUNKTUNE_IMAGE) by its trials. */}}
{{- define "chunktune.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- $repository := required (printf "image.repository is required: no chunktune image is published. Build one from the chunktune repository and push it (docker build -t REGISTRY/chunktune:%s . && docker push REGISTRY/chunktune:%s), then install with --set image.repository=REGISTRY/chunktune --set image.tag=%s" $tag $tag $tag) .Values.image.repository -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}

{{/* The state directory: where studies without spec.storage keep their Optuna journal. */}}
{{- define "chunktune.stateDir" -}}
/var/lib/chunktune
{{- end -}}

{{/* "true" when the replicas elect a leader (several replicas, or leaderElection.enabled). */}}
{{- define "chunktune.leaderElect" -}}
{{- if or (gt (int .Values.replicaCount) 1) .Values.leaderElection.enabled -}}true{{- end -}}
{{- end -}}

{{/*
Refuse values that would break high availability: several replicas need one state volume they
can all mount, and lease timings in which the leader stops before a standby may take over.
*/}}
{{- define "chunktune.checkReplicas" -}}
{{- if gt (int .Values.replicaCount) 1 -}}
{{- if and .Values.persistence.enabled (not .Values.persistence.existingClaim) (not (has "ReadWriteMany" .Values.persistence.accessModes)) -}}
{{- fail "replicaCount > 1 needs a state volume every replica can mount: set persistence.accessModes to [ReadWriteMany] (a storage class that offers it) or persistence.existingClaim, or persistence.enabled=false with studies in a database (storage.allowDatabaseURLs=true, spec.storageFrom)" -}}
{{- end -}}
{{- if and (not .Values.persistence.enabled) (not .Values.storage.allowDatabaseURLs) -}}
{{- fail "replicaCount > 1 with persistence.enabled=false would lose every journal study at each failover: enable persistence (ReadWriteMany) or keep studies in a database (storage.allowDatabaseURLs=true, spec.storageFrom)" -}}
{{- end -}}
{{- end -}}
{{- with .Values.leaderElection -}}
{{- if not (and (gt (float64 .leaseDuration) (float64 .renewDeadline)) (gt (float64 .renewDeadline) (float64 .retryPeriod))) -}}
{{- fail (printf "leaderElection needs leaseDuration > renewDeadline > retryPeriod (got %v, %v, %v): the leader must stop before a standby may take over" .leaseDuration .renewDeadline .retryPeriod) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The claim that holds the state directory. */}}
{{- define "chunktune.claimName" -}}
{{- default (printf "%s-state" (include "chunktune.fullname" .)) .Values.persistence.existingClaim -}}
{{- end -}}

{{/*
RBAC rules on namespaced resources: a ClusterRole's when every namespace is watched, each
watched namespace's Role otherwise. Least privilege; each rule says what needs it.
*/}}
{{- define "chunktune.rules.namespaced" -}}
{{- if or .Values.storage.allowDatabaseURLs .Values.policy.secretOptInLabel }}
# Secrets, read only, in two opt-in cases: storage.allowDatabaseURLs (spec.storageFrom: a
# study's database URL with its credentials from a Secret's key) and policy.secretOptInLabel
# (a trial may reference a Secret labelled chunktune.dev/allow-reference: "true"; the operator
# reads the label before creating the pod). Otherwise no Secrets: trial pods only reference
# them (e.g. HF_TOKEN via secretKeyRef) and the kubelet, not the operator, reads them.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
# The tuning objects: kopf watches them and patches its annotations and finalizer onto them.
- apiGroups: ["chunktune.dev"]
  resources: ["chunkedprefilltunings"]
  verbs: ["get", "list", "watch", "patch", "update"]
# Progress and results.
- apiGroups: ["chunktune.dev"]
  resources: ["chunkedprefilltunings/status"]
  verbs: ["get", "patch", "update"]
# Trial objects carry ownerReferences with blockOwnerDeletion, which the
# OwnerReferencesPermissionEnforcement admission plugin allows only with this.
- apiGroups: ["chunktune.dev"]
  resources: ["chunkedprefilltunings/finalizers"]
  verbs: ["update"]
# Each trial's engine pod (vllm serve or chunktune sim serve); the logs say why an engine
# failed to start, and carry the load Job's summary.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
# Each trial's load Job (chunktune load run against the engine).
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
# A distributed load's Service in front of Locust's master (workload.loadWorkers).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "create", "delete"]
# Each trial's workload profile, and spec.output.configMap (the best flags).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
# kopf reports handler progress as Events on the tuning object.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
# spec.output.patchDeployment: the best flags written into a serving Deployment's args.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "patch"]
{{- end -}}

{{/* RBAC rules on cluster-scoped resources: always in a ClusterRole. */}}
{{- define "chunktune.rules.cluster" -}}
# kopf's namespace discovery.
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
# kopf's resource discovery (is the ChunkedPrefillTuning CRD installed, which versions).
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
{{- end -}}
