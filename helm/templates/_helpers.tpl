{{- define "moeproxy.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "moeproxy.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "moeproxy.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "moeproxy.secretName" -}}
{{- if .Values.postgres.existingSecret -}}
{{- .Values.postgres.existingSecret -}}
{{- else -}}
{{- include "moeproxy.fullname" . -}}
{{- end -}}
{{- end -}}

{{/* The Ray cluster the workers join: the given address, the chart's RayCluster, or none (local). */}}
{{- define "moeproxy.rayAddress" -}}
{{- if .Values.ray.address -}}
{{- .Values.ray.address -}}
{{- else if .Values.ray.kuberay.enabled -}}
{{- printf "%s-ray-head-svc:6379" (include "moeproxy.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* An accelerator limit: nvidia -> nvidia.com/gpu, ascend -> huawei.com/Ascend910, none -> nothing. */}}
{{- define "moeproxy.acceleratorLimit" -}}
{{- if eq .kind "nvidia" -}}
nvidia.com/gpu: {{ .count }}
{{- else if eq .kind "ascend" -}}
huawei.com/Ascend910: {{ .count }}
{{- end -}}
{{- end -}}

{{/* The shared data volume and the read-only models volume. */}}
{{- define "moeproxy.volumes" -}}
- name: data
{{- if .Values.data.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.data.existingClaim }}
{{- else }}
  emptyDir: {}
{{- end }}
- name: models
{{- if .Values.models.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.models.existingClaim }}
    readOnly: true
{{- else }}
  emptyDir: {}
{{- end }}
{{- end -}}

{{/* The device a reproduction runs on (MOEPROXY_JOB_DEVICE): the accelerator of the pool the
     jobs run on, the KubeRay workers' when the chart makes the cluster, else the worker pod's. An
     external Ray address keeps the worker's own setting. */}}
{{- define "moeproxy.jobDevice" -}}
{{- $kind := .Values.worker.accelerator -}}
{{- if and .Values.ray.kuberay.enabled (not .Values.ray.address) -}}
{{- $kind = .Values.ray.kuberay.accelerator -}}
{{- end -}}
{{- if eq $kind "nvidia" -}}cuda{{- else if eq $kind "ascend" -}}npu{{- else -}}cpu{{- end -}}
{{- end -}}
